"""A SparkSession set up the way streamtrain needs it (the facts behind each setting are in DESIGN.md)."""

from __future__ import annotations

import os
import sys
from typing import Any


def session(master: str = "local[*]", *, app: str = "streamtrain", conf: dict[str, str] | None = None) -> Any:
    """Get or create a SparkSession for streamtrain.

    * Python workers run this interpreter, or they start a Python without our packages.
    * The driver JVM gets a 16 MB thread stack: stopping a query inside foreachBatch
      otherwise dies with a StackOverflowError that hides the real error.
    * It compiles with C1 only: C2's compiler threads compete with TensorFlow's start-up
      for the cores (start-up 2 s shorter on 2 cores), and the JVM is not on the hot path
      (Python reads and trains the records).
    * Local mode binds the driver to loopback; the UI is off unless asked for.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # nothing bound beyond loopback
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master).appName(app)
        .config("spark.driver.extraJavaOptions", "-Xss16m -XX:TieredStopAtLevel=1")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")  # our own status line says more
    )
    if master.startswith("local"):
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
