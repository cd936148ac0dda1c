"""Spark's Python worker daemon, with TensorFlow imported before it forks the workers.

Spark starts one daemon per executor (``spark.python.daemon.module``) and forks every
Python worker from it. Imported here once, TensorFlow and Keras are in each worker the
moment it is forked: no worker pays the import (seconds each), and their pages of
TensorFlow's code and data are shared copy-on-write instead of loaded once per worker.

Only the import happens before the fork. Importing starts no TensorFlow runtime (no
thread pools, no device, no session): those are created by a worker's first operation,
after the fork, in the worker, with the thread count it sets
(:func:`pipeline.train.replica.init_tensorflow`). Forking a process whose threads hold
locks would leave the child deadlocked; the threads TensorFlow has at import (a couple of
idle helpers) hold none that a worker takes. ``STREAMTRAIN_PRELOAD_TENSORFLOW=false``
turns this off (the plain ``pyspark.daemon`` is used).

The JVM reads the daemon's port from its standard output, so nothing here may print.
"""

from __future__ import annotations

import os
import sys


def preload() -> None:
    """Import TensorFlow and Keras, quietly (standard output belongs to Spark)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    stdout = sys.stdout
    sys.stdout = sys.stderr  # a library that prints while importing must not reach the JVM
    try:
        import keras  # noqa: F401
        import tensorflow  # noqa: F401
    except Exception as e:  # noqa: BLE001 - workers then import it themselves, and fail there if they must
        print(f"streamtrain: TensorFlow not preloaded in Spark's daemon: {e}", file=sys.stderr)
    finally:
        sys.stdout = stdout


if __name__ == "__main__":
    preload()
    from pyspark import daemon

    daemon.manager()
