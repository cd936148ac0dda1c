"""Observe: Prometheus metrics (declared once, in :mod:`~pipeline.observe.metrics`), the
Grafana dashboard (:mod:`~pipeline.observe.dashboard`), and pictures of a run or of the
dashboard without Grafana (:mod:`~pipeline.observe.render`, :mod:`~pipeline.observe.report_plot`).

Importing the package is cheap: the names below load their module on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline import exports

if TYPE_CHECKING:
    from pipeline.observe.metrics import (
        ProducerMetrics,
        TrainingMetrics,
        producer_metrics,
        training_metrics,
    )

_EXPORTS = {
    "ProducerMetrics": "pipeline.observe.metrics",
    "TrainingMetrics": "pipeline.observe.metrics",
    "producer_metrics": "pipeline.observe.metrics",
    "training_metrics": "pipeline.observe.metrics",
}


__getattr__ = exports.lazy(__name__, _EXPORTS)


__all__ = ["ProducerMetrics", "TrainingMetrics", "producer_metrics", "training_metrics"]
