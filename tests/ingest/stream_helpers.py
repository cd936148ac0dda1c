"""Handlers for the stream tests, and a driver process to kill mid-batch.

Spark ships these to its Python workers by value (see register()), so they
need not be importable there.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.ingest import microbatch as stream
from pipeline.ingest.batch_figures import BatchFigures


def register() -> None:
    """Pickle this module by value, so Spark's workers need not import it."""
    import pyspark.cloudpickle as cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Recording(stream.Handler):
    """Returns every record's id and offset; on the driver, appends batches to a JSON-lines
    ledger."""

    def __init__(self, ledger: str | None = None, hang_on_batch: int | None = None) -> None:
        self.ledger = ledger
        self.hang_on_batch = hang_on_batch

    def process(self, block: stream.Block) -> dict[str, Any]:
        return {
            "ids": block.ids.tolist(),
            "offsets": block.offsets.tolist(),
            "partition": block.partition,
            "labels": block.y.tolist(),
        }

    def on_batch(self, info: BatchFigures) -> None:
        if self.ledger:
            with open(self.ledger, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "batch_id": info.batch_id,
                            "ranges": [dataclasses.astuple(r) for r in info.ranges],
                            "rows": info.rows,
                            "pid": os.getpid(),
                        }
                    )
                    + "\n"
                )
                f.flush()
                os.fsync(f.fileno())
        if self.hang_on_batch is not None and info.batch_id == self.hang_on_batch:
            time.sleep(600)  # killed here, mid-batch, before Spark commits it


def child(bootstrap: str, topic: str, checkpoint: str, ledger: str, hang_on_batch: int) -> None:
    """A driver that stops (hangs) inside batch ``hang_on_batch``, waiting to be killed."""
    from pipeline import cluster, codec

    register()
    spark = cluster.session("local[2]", app="streamtrain-child")
    job = stream.StreamJob(
        spark,
        bootstrap=bootstrap,
        topics=[topic],
        schema=codec.HIGGS,
        handler=Recording(ledger, hang_on_batch),
        checkpoint=checkpoint,
        source="python",
        max_offsets_per_trigger=1000,
    )
    job.run(timeout_s=300)


if __name__ == "__main__":
    child(*sys.argv[1:5], int(sys.argv[5]))
    Path(sys.argv[4]).with_suffix(".done").write_text("done")
