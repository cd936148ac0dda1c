"""A replica's training step that also returns the loss's gradient with respect to its input:
what an ID model's rows learn from (:mod:`pipeline.train.id_rows`).

``train_on_batch`` keeps the input's gradient to itself; this step is the same step (the
compiled loss, the replica's optimizer on its trainable weights) in one traced function
that hands it back, so the rows cost no second forward pass. TensorFlow backend only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.train.model import ModelSpec, accuracy_of, input_shape, label_signature


class InputGradientStep:
    """``step(x, y)`` trains the replica's model on one mini-batch and returns its loss, its
    accuracy (NaN without classes), the gradient of the loss with respect to ``x`` and the
    model's outputs (before the step)."""

    def __init__(self, model: Any, spec: ModelSpec) -> None:
        import tensorflow as tf

        shape = input_shape(model)
        labels, self._out = label_signature(model, spec)
        accuracy = accuracy_of(spec.loss)
        trainable = model.trainable_weights
        optimizer = model.optimizer
        if not optimizer.built:
            optimizer.build(trainable)

        def step(x: Any, y: Any) -> Any:
            with tf.GradientTape() as tape:
                tape.watch(x)
                pred = model(x, training=True)
                loss = model.compute_loss(x=x, y=y, y_pred=pred, training=True)
            *grads, gx = tape.gradient(loss, [*trainable, x])
            optimizer.apply(grads, trainable)
            return loss, accuracy(y, pred), gx, pred

        self._step = tf.function(
            step, input_signature=[tf.TensorSpec([None, *shape], tf.float32), labels]
        )

    def __call__(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float, np.ndarray, np.ndarray]:
        if self._out is not None and y.shape[1:] != self._out:  # (n,) labels for (n, 1) outputs
            y = y.reshape((len(y), *self._out))
        loss, acc, gx, pred = self._step(x, y)
        return float(loss), float(acc), np.asarray(gx), np.asarray(pred)
