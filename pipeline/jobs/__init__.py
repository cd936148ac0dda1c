"""Jobs: the stages wired together. :mod:`~pipeline.jobs.online` is ``streamtrain run``
(replay, stream, train, checkpoint, report); :mod:`~pipeline.jobs.trainer` is the batch
API, ``Trainer(model).train(data)``; :mod:`~pipeline.jobs.predict` is ``streamtrain predict``.

Importing the package is cheap: the names below load their module on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline import exports

if TYPE_CHECKING:
    from pipeline.jobs.online import Run, run
    from pipeline.jobs.predict import PredictConfig
    from pipeline.jobs.report import RunReport
    from pipeline.jobs.run_config import RunConfig
    from pipeline.jobs.trainer import Trainer

_EXPORTS = {
    "Run": "pipeline.jobs.online",
    "run": "pipeline.jobs.online",
    "RunConfig": "pipeline.jobs.run_config",
    "RunReport": "pipeline.jobs.report",
    "Trainer": "pipeline.jobs.trainer",
    "PredictConfig": "pipeline.jobs.predict",
}


__getattr__ = exports.lazy(__name__, _EXPORTS)


__all__ = ["PredictConfig", "Run", "RunConfig", "RunReport", "Trainer", "run"]
