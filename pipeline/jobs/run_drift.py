"""A run's drift signals, wired: the detectors, the reaction (``--on-drift``), the metrics
and the status line (:mod:`pipeline.train.drift`, :mod:`pipeline.train.adapt`)."""

from __future__ import annotations

from typing import Any

from pipeline.jobs.display import Display
from pipeline.jobs.run_config import RunConfig
from pipeline.jobs.run_metrics import RunMetrics
from pipeline.train.adapt import DriftResponse
from pipeline.train.drift import Drift, DriftSettings, DriftWatch
from pipeline.train.driver import TrainDriver

#: The post-drift held-out window: records, at most (fewer with a smaller --eval-max).
WINDOW = 2_000


def columns(schema: Any) -> list[str] | None:
    """The feature signal's columns: a table's by name (its encoded width, if the encoding
    widens it, by index), a float record's by index; None for images (a pixel alone means
    little, and the loss signal sees what they do)."""
    if schema.dtype != "float32":
        return None
    names = list(schema.table.columns()) if schema.table is not None else []
    return names if len(names) == schema.n_features else [f"x{i}" for i in range(schema.n_features)]


def watch(training: Any, *, handler: Any, schema: Any) -> DriftResponse:
    """Give a run's driver (its ``training``, a :class:`~pipeline.jobs.run_training.RunTraining`)
    its drift signals and reaction, once its held-out evaluation and watch are set."""
    driver: TrainDriver = training.driver
    cfg: RunConfig = training.cfg
    metrics: RunMetrics = training.metrics
    display: Display = training.display

    def on_drift(drifts: list[Drift]) -> None:
        metrics.on_drift(drifts)
        display.on_drift(drifts)

    extra = driver.state.extra if driver.state is not None else {}
    found = extra.get("drift", [])
    signals = DriftWatch(
        classes=0 if schema.regression else schema.num_classes,
        columns=columns(schema),
        settings=DriftSettings.parse(cfg.drift),
        found=found,
    )
    response = DriftResponse(
        signals,
        cfg.on_drift,
        handler=handler,
        batch_size=training.algorithm.worker_batch_size,
        window=min(cfg.eval_max, WINDOW),
        on_drift=on_drift,
        # The server's optimizer: this process's algorithm, or every shard process's.
        algorithm=training.algorithm if cfg.ps_shards == 1 else training.server,
    )
    response.evaluation, response.regression = training.evaluation, schema.regression
    if found:  # a resumed run after a drift: its held-out score is on records after it again
        response.resumed(driver, extra.get("adapt"))
    driver.watch_drift(response)
    return response
