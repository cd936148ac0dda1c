"""Warming the executors up before the first micro-batch: TensorFlow imported, replicas
built and traced, in each Python worker that will train."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from pipeline import cluster
from pipeline.train.model import ModelSpec

log = logging.getLogger(__name__)


def warm_up(
    spark: Any,
    spec: ModelSpec,
    job: str,
    *,
    workers: int,
    threads: int,
    batch: int,
    gradients: bool = False,
) -> None:
    """Import TensorFlow, build the replica and trace its functions in each executor
    Python worker before the first batch, so that it trains at full speed."""

    def build(_task: int) -> tuple[int, float, float]:
        began = time.monotonic()
        from pipeline.train.replica import init_tensorflow, replica

        init_tensorflow(threads)
        imported = time.monotonic()
        _, fresh = replica(spec, job=job, threads=threads, prime_batch=batch, gradients=gradients)
        built = time.monotonic()
        if not fresh:
            time.sleep(0.5)  # hold the slot, so each task lands in its own Python worker
        return os.getpid(), imported - began, built - imported

    started = time.monotonic()
    done = cluster.run_on_executors(
        spark, range(workers), build, description="streamtrain: warm up the workers"
    )
    log.info(
        "replicas ready in %d worker processes in %.1f s (TensorFlow import %s s, build and trace "
        "%s s)",
        len({pid for pid, _, _ in done}),
        time.monotonic() - started,
        "/".join(f"{i:.1f}" for _, i, _ in done),
        "/".join(f"{b:.1f}" for _, _, b in done),
    )
