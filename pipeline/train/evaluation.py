"""Held-out evaluation on the workers' replicas (the driver holds no TensorFlow), and the scores."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import cluster, codec
from pipeline.train.model import ModelSpec

#: Held-out records below which no score is given: on fewer, one record moves accuracy by
#: five points or more, and a run's stop rules would chase noise.
MIN_SCORED = 20


class Evaluation:
    """The held-out split, scored on the workers' replicas.

    The raw records travel to the executors once, as a broadcast; each scoring is
    a Spark job of one task per shard, each task scoring every k-th record.

    Args:
        spark: the SparkSession.
        spec: the model.
        schema: the records' layout.
        x, y: the held-out records (wire dtype) and labels.
        job: the run's id (the replicas' cache key).
        threads: TensorFlow threads per task.
        shards: tasks per scoring.
    """

    def __init__(
        self,
        spark: Any,
        spec: ModelSpec,
        *,
        schema: codec.Schema,
        x: np.ndarray,
        y: np.ndarray,
        job: str,
        threads: int,
        shards: int,
    ) -> None:
        self.spark, self.spec, self.schema, self.y = spark, spec, schema, y
        self.job, self.threads, self.shards = job, threads, max(1, min(shards, len(y)))
        self._x = spark.sparkContext.broadcast(x)
        #: How the tasks reach the row servers, for a model with ID features (the handler's
        #: :class:`~pipeline.train.partition.ServerInfo`; None: none).
        self.server: Any = None

    @property
    def can_score(self) -> bool:
        """Whether the held-out split is large enough to score (:data:`MIN_SCORED`)."""
        return len(self.y) >= MIN_SCORED

    def predict(self, weights: np.ndarray) -> np.ndarray:
        """The model's outputs on the held-out records with ``weights``."""
        spec, schema, job, threads, shards, records, server = (
            self.spec,
            self.schema,
            self.job,
            self.threads,
            self.shards,
            self._x,
            self.server if self.server is not None and self.server.rows else None,
        )

        def task(i: int) -> np.ndarray:
            from pipeline.train.replica import predict

            x = schema.to_model_input(records.value[i::shards])
            if server is not None:  # the IDs' rows, read as they are now
                from pipeline.table.ids import IdLayout
                from pipeline.train.id_rows import model_input

                with server.row_client(worker=i) as client:
                    x, _ = model_input(IdLayout(schema.table), client, x)
            return predict(spec, weights, x, job=job, threads=threads)

        parts = cluster.run_on_executors(
            self.spark, range(shards), task, description="streamtrain: score the held-out split"
        )
        probs = np.empty((len(self.y), *parts[0].shape[1:]), parts[0].dtype)
        for i, part in enumerate(parts):
            probs[i::shards] = part
        return probs

    def score(self, weights: np.ndarray) -> dict[str, float]:
        """:func:`scores` of ``weights`` on the held-out split."""
        return scores(self.y, self.predict(weights), regression=self.schema.regression)

    def save_model(self, weights: np.ndarray, path: Path) -> None:
        """Write the model with ``weights`` as a ``.keras`` file (built on a worker)."""
        spec = self.spec

        def task(_: int) -> bytes:
            from pipeline.train.replica import model_file

            return model_file(spec, weights)

        [blob] = cluster.run_on_executors(
            self.spark, [0], task, description="streamtrain: save the model"
        )
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, path)

    def use(self, x: np.ndarray, y: np.ndarray) -> None:
        """Score ``x``/``y`` from now on (after a drift: records held out since it)."""
        old, self._x = self._x, self.spark.sparkContext.broadcast(x)
        self.y = y
        self.shards = max(1, min(self.shards, len(y)))
        old.destroy()

    def suspend(self) -> None:
        """Give no score until :meth:`use` (the split no longer describes the stream)."""
        self.y = self.y[:0]

    def close(self) -> None:
        self._x.destroy()


def scores(y: np.ndarray, probs: np.ndarray, *, regression: bool = False) -> dict[str, float]:
    """Accuracy of class probabilities ``probs`` against labels ``y``, and ROC AUC for two
    classes; for a numeric target, the root mean squared error and the mean absolute error.

    >>> scores(np.array([0, 1, 1]), np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]))
    {'accuracy': 0.6666666666666666, 'auc': 1.0}
    >>> scores(np.array([1.0, 3.0]), np.array([[2.0], [3.0]]), regression=True)
    {'rmse': 0.7071067811865476, 'mae': 0.5}
    """
    if regression:
        err = probs.reshape(len(y), -1)[:, 0].astype(np.float64) - y
        return {"rmse": float(np.sqrt(np.mean(err**2))), "mae": float(np.mean(np.abs(err)))}
    out = {"accuracy": float((probs.argmax(axis=1) == y).mean())}
    if probs.shape[1] == 2:
        out["auc"] = roc_auc(y, probs[:, 1])
    return out


def roc_auc(y: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC from ranks (Mann-Whitney U), ties averaged.

    >>> roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
    0.75
    """
    # Average ranks of tied scores, as Mann-Whitney U needs.
    _, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
