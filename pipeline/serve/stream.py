"""The predict stream: records of an input topic scored through Spark micro-batches, one
prediction per record written to an output topic.

Each prediction is a JSON value keyed by the input record's key::

    {"topic": "mnist", "partition": 0, "offset": 41, "id": 41, "version": 1280,
     "class": 7, "probabilities": [...]}

``version`` is the parameter server's clock of the weights used: the run's checkpoint,
reloaded by each executor when the run writes a newer one (so a run still training is
served as it learns, a micro-batch behind).

Delivery: every input record's prediction is in the output topic before Spark commits
the micro-batch (a failed send fails the batch), and a restarted job continues after
the last committed batch. A batch that was written but not committed when the job died
is written again on restart: at least once, with ``(topic, partition, offset)`` in each
prediction so that a reader drops repeats (keep the first). Exactly once would need
Kafka transactions that span the Spark commit, which neither embeddable broker offers.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import record_key
from pipeline.ingest.batch_figures import BatchFigures
from pipeline.ingest.decode import Block
from pipeline.ingest.microbatch import Handler
from pipeline.train.model import ModelSpec

#: per Python worker: the run folder -> (checkpoint stamp, weights, version); bootstrap -> producer
_WEIGHTS: dict[str, tuple[tuple[int, int], np.ndarray, int]] = {}
_PRODUCERS: dict[tuple[str, str | None], Any] = {}


@dataclasses.dataclass
class Predicted:
    """What one task wrote."""

    written: int
    version: int


def _weights(run_dir: str) -> tuple[np.ndarray, int]:
    from pipeline.train import checkpoint

    path = Path(run_dir) / checkpoint.FILENAME
    stat = path.stat()
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = _WEIGHTS.get(run_dir)
    if cached is None or cached[0] != stamp:
        state = checkpoint.load(run_dir)
        assert state is not None
        cached = _WEIGHTS[run_dir] = (
            stamp,
            np.asarray(state.weights, np.float32),
            int(state.clock),
        )
    return cached[1], cached[2]


def _producer(bootstrap: str, kafka_conf: str | None) -> Any:
    from pipeline.ingest.kafka import client, conf

    producer = _PRODUCERS.get((bootstrap, kafka_conf))
    if producer is None:
        producer = _PRODUCERS[(bootstrap, kafka_conf)] = client.producer(
            bootstrap,
            conf=conf.load(kafka_conf),
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            batch_size=1 << 20,
        )
    return producer


def prediction_values(block: Block, probs: np.ndarray, version: int) -> list[bytes]:
    """The JSON values of a block's predictions.

    >>> from pipeline import codec
    >>> b = Block("in", 1, np.zeros((2, 2)), np.zeros(2), np.array([7, 8], np.uint64),
    ...           np.array([40, 41]), np.zeros(2, np.int64), codec.generic(2, 2))
    >>> json.loads(prediction_values(b, np.array([[0.25, 0.75], [0.5, 0.5]]), 9)[0])["class"]
    1
    """
    out = []
    for i in range(len(block.offsets)):
        p = probs[i]
        out.append(
            json.dumps(
                {
                    "topic": block.topic,
                    "partition": block.partition,
                    "offset": int(block.offsets[i]),
                    "id": int(block.ids[i]),
                    "version": version,
                    "class": int(np.argmax(p)),
                    "probabilities": [round(float(v), 6) for v in p],
                }
            ).encode()
        )
    return out


@dataclasses.dataclass
class PredictHandler(Handler):
    """Scores each block with the run's newest checkpoint and writes the predictions.

    Args:
        run_dir: the run folder; executors read its ``state.npz``, so on a cluster it must
            be on storage every host mounts.
        spec: the run's model (its ``model.json``, read once on the driver).
        bootstrap, output_topic: where predictions go.
        kafka_conf: the Kafka client properties file (TLS, SASL), by path: executors read it.
        job: the replicas' cache key.
        threads: TensorFlow threads per task.
    """

    run_dir: str
    spec: ModelSpec
    bootstrap: str
    output_topic: str
    job: str
    threads: int = 1
    kafka_conf: str | None = None
    on_written: Any = None  # driver only: called with (records written, newest version) per batch

    wants_keys = True

    def process(self, block: Block) -> Predicted:
        from pipeline.train.replica import predict

        if not len(block.offsets):
            return Predicted(0, -1)
        weights, version = _weights(self.run_dir)
        # block.schema scales features as training did (a JSON encoding has the same units).
        probs = predict(
            self.spec,
            weights,
            block.schema.to_model_input(block.x),
            job=self.job,
            threads=self.threads,
        )
        producer = _producer(self.bootstrap, self.kafka_conf)
        keys = block.keys if block.keys is not None else record_key.encode_keys(block.ids)
        futures = [
            producer.send(self.output_topic, value=v, key=k)
            for k, v in zip(keys, prediction_values(block, probs, version), strict=True)
        ]
        producer.flush()
        failed = [f for f in futures if f.failed()]
        if failed:  # fails the task, so the batch is not committed and is replayed
            raise RuntimeError(
                f"{len(failed)} predictions were not acknowledged by Kafka: {failed[0].exception}"
            )
        return Predicted(len(futures), version)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["on_written"] = None  # a driver callback does not travel to the executors
        return state

    def on_batch(self, info: BatchFigures) -> None:
        results: list[Predicted] = [r for r in info.results if isinstance(r, Predicted)]
        if self.on_written is not None:
            self.on_written(
                sum(r.written for r in results), max((r.version for r in results), default=-1)
            )


def job_id(run_dir: str) -> str:
    """A replica cache key per run folder and process start (a fresh model per job)."""
    return f"predict-{abs(hash(os.path.abspath(run_dir)))}-{os.getpid()}"
