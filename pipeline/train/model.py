"""Models as data: what executors need to rebuild a replica, and weights as one flat buffer.

A :class:`ModelSpec` holds the model's Keras JSON, the optimizer and the loss; its
fingerprint keys the executors' replica cache. Keras is imported only when a
model is built, so the driver's parameter server and the producers stay light.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from typing import Any

import numpy as np

from pipeline.errors import ConfigError

#: Losses whose models get an accuracy metric.
CLASSIFICATION_LOSSES = (
    "sparse_categorical_crossentropy",
    "categorical_crossentropy",
    "binary_crossentropy",
)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A Keras model's architecture, optimizer and loss, as plain data.

    Attributes:
        architecture: ``model.to_json()``.
        optimizer: a Keras optimizer name or ``{"class_name", "config"}`` dict.
        loss: a Keras loss name.
        shapes: the shapes of ``model.get_weights()``, to cut the flat buffer.
        imports: modules defining the model's own classes, imported before rebuilding
            it (they must be importable where the workers run).
        trainable: per weight, whether gradients train it (empty: all do); batch-norm
            statistics do not.
    """

    architecture: str
    optimizer: str | dict[str, Any]
    loss: str
    shapes: tuple[tuple[int, ...], ...]
    imports: tuple[str, ...] = ()
    trainable: tuple[bool, ...] = ()

    @property
    def size(self) -> int:
        """Number of weights."""
        return int(sum(int(np.prod(s)) for s in self.shapes))

    def untrained(self) -> np.ndarray | None:
        """Per flat weight, whether gradients leave it alone (batch-norm statistics), or
        None when gradients train every weight.

        >>> ModelSpec(
        ...     "{}", "adam", "mse", ((2,), (1,)), trainable=(True, False)
        ... ).untrained().tolist()
        [False, False, True]
        """
        if not self.trainable or all(self.trainable):
            return None
        return np.repeat(~np.array(self.trainable), [int(np.prod(s)) for s in self.shapes])

    def piece(self, start: int, stop: int) -> ModelSpec:
        """The spec of the flat weights ``[start, stop)`` alone, as 1-D arrays (what a shard
        of the parameter server binds its rule to: sizes and which weights gradients train).

        >>> spec = ModelSpec("{}", "adam", "mse", ((2, 2), (3,)), trainable=(True, False))
        >>> piece = spec.piece(2, 6); piece.shapes, piece.untrained().tolist()
        (((2,), (2,)), [False, False, True, True])
        """
        shapes, trainable, at = [], [], 0
        for i, shape in enumerate(self.shapes):
            n = int(np.prod(shape))
            lo, hi = max(start, at), min(stop, at + n)
            if lo < hi:
                shapes.append((hi - lo,))
                trainable.append(self.trainable[i] if self.trainable else True)
            at += n
        return dataclasses.replace(
            self, shapes=tuple(shapes), trainable=tuple(trainable) if self.trainable else ()
        )

    @property
    def fingerprint(self) -> str:
        """A digest of everything that makes two replicas interchangeable."""
        blob = json.dumps(
            [self.architecture, self.optimizer, self.loss], sort_keys=True, default=str
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_json(self) -> str:
        """The spec as JSON (what a model-describing subprocess hands back).

        >>> spec = ModelSpec("{}", "adam", "mse", ((2, 3), (3,)))
        >>> ModelSpec.from_json(spec.to_json()) == spec
        True
        """
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        d = json.loads(text)
        return cls(
            d["architecture"],
            d["optimizer"],
            d["loss"],
            tuple(tuple(s) for s in d["shapes"]),
            tuple(d.get("imports", ())),
            tuple(bool(t) for t in d.get("trainable", ())),
        )

    @classmethod
    def from_model(cls, model: Any, *, optimizer: str | dict[str, Any], loss: str) -> ModelSpec:
        """Describe a built Keras model (Sequential, functional, or subclassed with get_config)."""
        if not model.built or not model.weights:
            raise ConfigError(
                "Expected a built Keras model with weights (give it an Input, or call it on one "
                "batch). Received an unbuilt one."
            )
        try:
            architecture = model.to_json()
        except (NotImplementedError, TypeError, ValueError) as e:
            raise ConfigError(
                f"The model cannot be serialized for the workers ({e}). A subclassed model needs "
                "get_config() and @keras.saving.register_keras_serializable()."
            ) from None
        layers = [model, *model._flatten_layers(include_self=False)]
        imports = sorted({type(x).__module__ for x in layers} - {"__main__"})
        imports = [m for m in imports if m.split(".")[0] not in ("keras", "tf_keras", "tensorflow")]
        shapes = tuple(tuple(w.shape) for w in model.get_weights())
        trainable = tuple(bool(w.trainable) for w in model.weights)  # the order of get_weights()
        return cls(
            architecture,
            optimizer,
            loss,
            shapes,
            tuple(imports),
            () if all(trainable) else trainable,
        )

    def build(self, *, compile: bool = True) -> Any:
        """A replica with freshly initialized weights, compiled unless asked not to."""
        import importlib

        import keras

        for module in self.imports:
            importlib.import_module(module)  # registers the model's custom classes

        model = keras.models.model_from_json(self.architecture)
        if not compile:
            return model
        # A classifier's accuracy comes with every training step's loss, computed in the
        # same forward pass (the prequential score).
        metrics = ["accuracy"] if self.loss in CLASSIFICATION_LOSSES else None
        model.compile(
            # A copy: Keras rewrites a config dict's class name in place, which would change
            # this spec's fingerprint (and miss every cached replica) once it is built.
            optimizer=keras.optimizers.get(copy.deepcopy(self.optimizer)),
            loss=self.loss,
            metrics=metrics,
        )
        return model


def input_shape(model: Any) -> tuple[int, ...]:
    """The shape of one example, for Sequential, functional and subclassed models."""
    inputs = getattr(model, "inputs", None)
    if inputs:
        return tuple(int(d) for d in inputs[0].shape[1:])
    built = (model.get_build_config() or {}).get("input_shape")
    if not built:
        raise ConfigError(
            "Cannot tell the model's input shape: call the model on one batch before training it."
        )
    return tuple(int(d) for d in built[1:])


def get_flat(model: Any) -> np.ndarray:
    """All of a model's weights as one float32 vector."""
    return np.concatenate([np.ravel(w) for w in model.get_weights()]).astype(np.float32, copy=False)


def set_flat(model: Any, flat: np.ndarray, shapes: tuple[tuple[int, ...], ...]) -> None:
    """Load a flat vector (from :func:`get_flat`) into a model's weights.

    >>> class Fake:
    ...     def set_weights(self, ws): self.ws = ws
    >>> m = Fake(); set_flat(m, np.arange(5, dtype=np.float32), ((2,), (3, 1)))
    >>> [w.tolist() for w in m.ws]
    [[0.0, 1.0], [[2.0], [3.0], [4.0]]]
    """
    out, offset = [], 0
    for shape in shapes:
        n = int(np.prod(shape))
        out.append(flat[offset : offset + n].reshape(shape))
        offset += n
    if offset != flat.size:
        raise ConfigError(f"Expected {offset} weights for this model. Received: {flat.size}")
    model.set_weights(out)


class FlatWeights:
    """Reads and writes a model's weights as one flat float32 vector, one TensorFlow call each.

    What :func:`get_flat` and :func:`set_flat` do, without a NumPy copy per layer
    and a Python call per variable: a worker exchanging every step does this
    hundreds of times a batch. Models on another Keras backend take the slow path.
    """

    def __init__(self, model: Any, shapes: tuple[tuple[int, ...], ...]) -> None:
        import keras

        self.model, self.shapes = model, shapes
        self.size = sum(int(np.prod(s)) for s in shapes)
        self._get = self._set = None
        if keras.backend.backend() != "tensorflow":
            return
        import tensorflow as tf

        variables = [w.value for w in model.weights]  # the order of get_weights()
        sizes = [int(np.prod(s)) for s in shapes]
        if [int(np.prod(v.shape)) for v in variables] != sizes:
            raise ConfigError(
                f"Expected weights of sizes {sizes}. Received: "
                f"{[tuple(v.shape) for v in variables]}"
            )

        def read() -> Any:
            return tf.concat([tf.reshape(tf.cast(v, tf.float32), [-1]) for v in variables], 0)

        def write(flat: Any) -> None:
            # Slices, not tf.split: measured 0.9 ms against 1.4 ms a call for the MNIST CNN,
            # paid by every worker at every exchange.
            start = 0
            for v, size, shape in zip(variables, sizes, shapes, strict=True):
                v.assign(tf.cast(tf.reshape(flat[start : start + size], shape), v.dtype))
                start += size

        # No autograph: nothing here branches on a tensor, and each function autograph converts
        # leaves a file in the temporary folder that only a clean exit removes (Spark's
        # Python workers do not exit cleanly).
        self._get = tf.function(read, autograph=False)
        self._set = tf.function(
            write, input_signature=[tf.TensorSpec([self.size], tf.float32)], autograph=False
        )

    def get(self) -> np.ndarray:
        """The weights now, as a new float32 vector."""
        if self._get is None:
            return get_flat(self.model)
        return np.asarray(self._get())

    def set(self, flat: np.ndarray) -> None:
        """Load a flat float32 vector into the weights."""
        if self._set is None:
            return set_flat(self.model, flat, self.shapes)
        if flat.shape != (self.size,):
            raise ConfigError(f"Expected {self.size} weights for this model. Received: {flat.size}")
        self._set(flat)


class FlatGradients:
    """One mini-batch's gradient of the compiled loss, as one flat float32 vector laid out
    like :class:`FlatWeights` (what synchronous SGD pushes), with the step's loss and accuracy.

    The forward pass runs in training mode, so dropout is on and batch-norm
    statistics move in the replica; a weight that gradients do not train gets 0
    in the vector (the worker sends its change instead). The function is traced
    once, for any batch size. TensorFlow backend only. With ``inputs`` it also takes the
    loss's gradient with respect to the input, :attr:`input_grad` (where an ID model's
    rows are, :mod:`pipeline.train.id_rows`).
    """

    def __init__(self, model: Any, spec: ModelSpec, *, inputs: bool = False) -> None:
        import tensorflow as tf

        self.size = spec.size
        variables = [w.value for w in model.weights]  # the order of get_weights()
        trainable = [bool(w.trainable) for w in model.weights]
        shape = input_shape(model)
        labels, self._out = label_signature(model, spec)
        accuracy = accuracy_of(spec.loss)
        self.inputs = inputs
        self.input_grad: np.ndarray | None = None  # with ``inputs``: the last call's
        self.pred: np.ndarray | None = None  # the last call's outputs

        def step(x: Any, y: Any) -> Any:
            watched = [v for v, t in zip(variables, trainable, strict=True) if t]
            with tf.GradientTape() as tape:
                tape.watch(x)
                pred = model(x, training=True)
                loss = model.compute_loss(x=x, y=y, y_pred=pred, training=True)
            grads = tape.gradient(loss, [*watched, x] if inputs else watched)
            gx = grads.pop() if inputs else tf.zeros([0])
            grads = iter(grads)
            parts = []
            for v, t in zip(variables, trainable, strict=True):
                g = next(grads) if t else None
                parts.append(
                    tf.reshape(tf.cast(g, tf.float32), [-1])
                    if g is not None
                    else tf.zeros([int(np.prod(v.shape))], tf.float32)
                )
            return tf.concat(parts, 0), loss, accuracy(y, pred), gx, pred

        self._step = tf.function(
            step, input_signature=[tf.TensorSpec([None, *shape], tf.float32), labels]
        )

    def __call__(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float, float]:
        """The gradient on ``x``/``y`` at the replica's weights, the loss and the accuracy."""
        if self._out is not None and y.shape[1:] != self._out:  # (n,) labels for (n, 1) outputs
            y = y.reshape((len(y), *self._out))
        flat, loss, acc, gx, pred = self._step(x, y)
        self.pred = np.asarray(pred)
        if self.inputs:
            self.input_grad = np.asarray(gx)
        return np.asarray(flat), float(loss), float(acc)


def label_signature(model: Any, spec: ModelSpec) -> tuple[Any, tuple[int, ...] | None]:
    """The labels a traced training step takes (a ``tf.TensorSpec``) and, for targets shaped
    like the outputs, the outputs' shape (labels of shape ``(n,)`` are reshaped to it)."""
    import tensorflow as tf

    if spec.loss.startswith("sparse"):
        return tf.TensorSpec([None], tf.int32), None
    zeros = np.zeros((1, *input_shape(model)), np.float32)
    out = tuple(np.shape(model.predict_on_batch(zeros))[1:])
    return tf.TensorSpec([None, *out], tf.float32), out


def accuracy_of(loss_name: str) -> Any:
    """The accuracy of a mini-batch's predictions as a TensorFlow function, for the
    compiled loss (NaN where the loss has no classes)."""
    import tensorflow as tf

    def accuracy(y: Any, pred: Any) -> Any:
        if loss_name == "sparse_categorical_crossentropy":
            hit = tf.equal(tf.argmax(pred, -1, output_type=tf.int32), tf.reshape(y, [-1]))
        elif loss_name == "categorical_crossentropy":
            hit = tf.equal(tf.argmax(pred, -1), tf.argmax(y, -1))
        elif loss_name == "binary_crossentropy":
            hit = tf.equal(tf.cast(pred > 0.5, y.dtype), y)
        else:
            return tf.constant(float("nan"))
        return tf.reduce_mean(tf.cast(hit, tf.float32))

    return accuracy


def reset_optimizer(model: Any) -> None:
    """Zero an optimizer's state (moments, step count) but keep its learning rate.

    In Keras 3 the learning rate is one of the optimizer's variables, so zeroing
    all of them would stop training.
    """
    opt = model.optimizer
    if opt is None or not opt.built:
        return
    keep = {id(getattr(opt, "_learning_rate", None))}
    for var in opt.variables:
        if id(var) not in keep and "learning_rate" not in var.path:
            var.assign(np.zeros(var.shape, var.dtype))
