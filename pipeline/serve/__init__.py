"""Serving the model a run trains: TensorFlow Serving's REST API over the live center
(``run --serve-port``) or a run's checkpoint (``streamtrain serve``), and the predict
stream (``streamtrain predict``). Only the serving process imports TensorFlow.

Importing the package is cheap: the names below load their module on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline import exports

if TYPE_CHECKING:
    from pipeline.serve.http import ModelServer
    from pipeline.serve.predictor import Predictor
    from pipeline.serve.process import ServingProcess, serve_folder
    from pipeline.serve.weights import CheckpointWeights, LiveWeights

_EXPORTS = {
    "ModelServer": "pipeline.serve.http",
    "Predictor": "pipeline.serve.predictor",
    "ServingProcess": "pipeline.serve.process",
    "serve_folder": "pipeline.serve.process",
    "CheckpointWeights": "pipeline.serve.weights",
    "LiveWeights": "pipeline.serve.weights",
}


__getattr__ = exports.lazy(__name__, _EXPORTS)


__all__ = [
    "CheckpointWeights",
    "LiveWeights",
    "ModelServer",
    "Predictor",
    "ServingProcess",
    "serve_folder",
]
