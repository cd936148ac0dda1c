"""A resident compiled Keras replica per executor Python worker, and what it does besides training.

Importing TensorFlow and building a model costs seconds, a weight exchange
milliseconds, so each Python worker process keeps one compiled replica per model
fingerprint (a module-level cache: best-effort, since Spark reaps idle Python
workers) and only swaps weights.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import numpy as np

from pipeline.train.model import (
    FlatGradients,
    FlatWeights,
    ModelSpec,
    input_shape,
    reset_optimizer,
    set_flat,
)


@dataclasses.dataclass
class Replica:
    """A resident compiled model, the job it last trained for, and its flat views."""

    model: Any
    job: str
    weights: FlatWeights
    spec: ModelSpec
    _gradients: FlatGradients | None = None
    base_lr: float | None = (
        None  # its optimizer's learning rate as compiled (--on-drift adapt scales it)
    )
    lr_scale: float = 1.0
    #: Whether each step also returns the input's gradient (an ID model's rows learn from it).
    input_grads: bool = False
    _input_step: Any = None

    @property
    def gradients(self) -> FlatGradients:
        """The flat-gradient function (built on first use: only synchronous SGD needs it)."""
        if self._gradients is None or self._gradients.inputs != self.input_grads:
            # (the warm-up traced it before a partition asked for the input's gradient)
            self._gradients = FlatGradients(self.model, self.spec, inputs=self.input_grads)
        return self._gradients

    @property
    def input_step(self) -> Any:
        """The training step that also returns the input's gradient (built on first use)."""
        if self._input_step is None:
            from pipeline.train.input_step import InputGradientStep

            self._input_step = InputGradientStep(self.model, self.spec)
        return self._input_step


#: model fingerprint -> its replica in this process
_REPLICAS: dict[str, Replica] = {}


def init_tensorflow(threads: int) -> None:
    """Limit TensorFlow to ``threads`` cores (before its first use in this process)."""
    if "tensorflow" not in sys.modules:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        os.environ["TF_NUM_INTRAOP_THREADS"] = str(threads)
        os.environ["TF_NUM_INTEROP_THREADS"] = "1"
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    except RuntimeError:
        pass  # already initialized in this process: the first setting stays


def replica(
    spec: ModelSpec,
    *,
    job: str,
    threads: int = 1,
    prime_batch: int = 0,
    gradients: bool = False,
    lr_scale: float | None = None,
) -> tuple[Replica, bool]:
    """The cached compiled replica for ``spec`` (built if new); a new ``job`` resets its
    optimizer; ``lr_scale`` (None: leave as it is) multiplies its compiled learning rate.

    With ``prime_batch`` > 0 a new replica is also traced (see :func:`prime`): its
    gradient function if ``gradients`` (synchronous SGD), else its train function.
    Returns the replica and whether it was built now.
    """
    init_tensorflow(threads)
    key = spec.fingerprint  # before the build, which must not change it (nor may anything)
    entry = _REPLICAS.get(key)
    if entry is None:
        model = spec.build()
        entry = _REPLICAS[key] = Replica(model, job, FlatWeights(model, spec.shapes), spec)
        if prime_batch:
            prime(entry, prime_batch, gradients=gradients)
        _scale_lr(entry, lr_scale)
        return entry, True
    if entry.job != job:
        reset_optimizer(entry.model)
        entry.job = job
    _scale_lr(entry, lr_scale)
    return entry, False


def _scale_lr(entry: Replica, scale: float | None) -> None:
    """Set the replica's learning rate to ``scale`` times the compiled one (a model whose
    optimizer has a schedule, not a number, keeps it)."""
    opt = entry.model.optimizer
    if scale is None or scale == entry.lr_scale or opt is None:
        return
    if entry.base_lr is None:
        lr = getattr(opt, "_learning_rate", None)
        if lr is None or callable(lr):  # a schedule
            return
        entry.base_lr = float(np.asarray(lr))
    opt.learning_rate = entry.base_lr * scale
    entry.lr_scale = scale


def prime(entry: Replica, batch: int, *, gradients: bool = False) -> None:
    """Trace the replica's train function (or its gradient function) on zeros, then forget
    those steps.

    TensorFlow traces a function on its first call (about a second for the MNIST
    CNN) and once more for the first batch of another size (a partition's last,
    short batch); done here, in the warm-up, the first micro-batch trains at full
    speed. The weights it changes are replaced by the first pull, and the
    optimizer state it creates is zeroed.
    """
    model, spec = entry.model, entry.spec
    shape = input_shape(model)
    x = np.zeros((batch, *shape), np.float32)
    if spec.loss.startswith("sparse"):
        y = np.zeros(batch, np.int32)
    else:  # targets shaped like the outputs
        y = np.zeros((batch, *np.shape(model.predict_on_batch(x[:1]))[1:]), np.float32)
    if gradients:
        entry.gradients(x, y)  # traced for any batch size at once
        return
    for n in (batch, 1, batch):
        model.train_on_batch(x[:n], y[:n])
    reset_optimizer(model)


def predict(
    spec: ModelSpec,
    weights: np.ndarray,
    x: np.ndarray,
    *,
    job: str,
    threads: int = 1,
    chunk: int = 1000,
) -> np.ndarray:
    """The model's outputs on ``x`` with ``weights``, scored on this worker's resident replica.

    The replica's own weights are overwritten; its next partition starts with a pull
    anyway. Its optimizer state is left alone.
    """
    entry, _ = replica(spec, job=job, threads=threads)
    entry.weights.set(np.asarray(weights, np.float32))
    model = entry.model
    shape = input_shape(model)
    x = x.reshape((len(x), *shape))
    return np.concatenate(
        [np.asarray(model.predict_on_batch(x[i : i + chunk])) for i in range(0, len(x), chunk)]
    )


def model_file(spec: ModelSpec, weights: np.ndarray) -> bytes:
    """A ``.keras`` file of the model with ``weights``: a fresh, uncompiled model, not a
    replica with its optimizer state."""
    import tempfile

    model = spec.build(compile=False)
    set_flat(
        model, np.asarray(weights, np.float32), spec.shapes
    )  # once: not worth tracing a function
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        with open(path, "rb") as f:
            return f.read()
