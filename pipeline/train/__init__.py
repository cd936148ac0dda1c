"""Train: from decoded blocks to center weights.

* :mod:`~pipeline.train.model` (a model as data, flat weights) and :mod:`~pipeline.train.zoo`
  (the built-in models); :mod:`~pipeline.train.probe` describes a model without TensorFlow
  in the driver.
* :mod:`~pipeline.train.replica` (the resident replica per executor Python worker),
  :mod:`~pipeline.train.partition` (training one partition), :mod:`~pipeline.train.handler`
  (the stream handler that does it per block), :mod:`~pipeline.train.warmup`.
* :mod:`~pipeline.train.algorithms` (each with its worker and server halves) and
  :mod:`~pipeline.train.ps` (the parameter server); :mod:`~pipeline.train.server` starts
  one for an algorithm.
* :mod:`~pipeline.train.driver` (exactly once: skip, check, save, release, per batch) with
  :mod:`~pipeline.train.checkpoint` and :mod:`~pipeline.train.ledger`; :mod:`~pipeline.train.rows`
  (a trained batch's figures); :mod:`~pipeline.train.evaluation` (held-out scores).

Importing the package is cheap: TensorFlow loads in the executors, when a replica is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline import exports

if TYPE_CHECKING:
    from pipeline.train.driver import TrainDriver
    from pipeline.train.evaluation import Evaluation, roc_auc, scores
    from pipeline.train.handler import TrainHandler
    from pipeline.train.model import ModelSpec
    from pipeline.train.partition import ServerInfo, TaskResult, train_partition
    from pipeline.train.rows import BatchRow, TaskRow
    from pipeline.train.server import parameter_server

_EXPORTS = {
    "parameter_server": "pipeline.train.server",
    "TrainDriver": "pipeline.train.driver",
    "BatchRow": "pipeline.train.rows",
    "TaskRow": "pipeline.train.rows",
    "Evaluation": "pipeline.train.evaluation",
    "roc_auc": "pipeline.train.evaluation",
    "scores": "pipeline.train.evaluation",
    "TrainHandler": "pipeline.train.handler",
    "ModelSpec": "pipeline.train.model",
    "TaskResult": "pipeline.train.partition",
    "ServerInfo": "pipeline.train.partition",
    "train_partition": "pipeline.train.partition",
}


__getattr__ = exports.lazy(__name__, _EXPORTS)


__all__ = [
    "BatchRow",
    "Evaluation",
    "ModelSpec",
    "TaskResult",
    "ServerInfo",
    "TaskRow",
    "TrainDriver",
    "TrainHandler",
    "parameter_server",
    "roc_auc",
    "scores",
    "train_partition",
]
