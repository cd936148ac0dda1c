"""Which reaction to an abrupt change recovers best: what ``--on-drift adapt`` does was
chosen by this measurement (docs/drift.md has its figures).

A Keras MLP (784-256-10, Adam at 0.001, mini-batches of 128) learns MNIST for 30,000 records;
then the labels are permuted, and each arm goes on from the same weights and optimizer state
for 20,000 records: nothing, Adam's moments reset, and the learning rate raised by a factor
for a number of records (with and without a reset). Its figure: the prequential accuracy
(each mini-batch scored before it trains) over those 20,000 records.

    .venv/bin/python bench/drift_adapt.py      # about a minute on 2 cores
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PRE, AFTER, BATCH, LR = 30_000, 20_000, 128, 1e-3
#: name -> (reset the moments, the rate's factor, for how many records)
ARMS = {
    "nothing (alert)": (False, 1.0, 0),
    "reset moments": (True, 1.0, 0),
    "reset, rate x3 for 2,000": (True, 3.0, 2_000),
    "rate x3 for 2,000": (False, 3.0, 2_000),
    "rate x3 for 5,000": (False, 3.0, 5_000),
    "rate x3 for 10,000": (False, 3.0, 10_000),
    "rate x10 for 2,000": (False, 10.0, 2_000),
    "rate x5 for 5,000": (False, 5.0, 5_000),
}


def main() -> None:
    import keras

    from pipeline.train.model import reset_optimizer
    from producers.datasets import mnist

    arrays = mnist.load_arrays()
    x = arrays["x_train"].reshape(-1, 784).astype("float32") / 255
    y = arrays["y_train"].astype("int32")
    permuted = np.roll(np.arange(10), 3)  # every class gets another's label
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(256, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(LR), loss="sparse_categorical_crossentropy")
    for i in range(0, PRE, BATCH):
        model.train_on_batch(x[i : i + BATCH], y[i : i + BATCH])
    weights = model.get_weights()
    state = [v.numpy().copy() for v in model.optimizer.variables]
    xs, ys = x[PRE : PRE + AFTER], permuted[y[PRE : PRE + AFTER]]
    for name, (reset, factor, records) in ARMS.items():
        model.set_weights(weights)
        for var, value in zip(model.optimizer.variables, state, strict=True):
            var.assign(value)
        if reset:
            reset_optimizer(model)
        hits = 0
        for i in range(0, AFTER, BATCH):
            model.optimizer.learning_rate.assign(LR * (factor if i < records else 1.0))
            hits += int(
                (model.predict_on_batch(xs[i : i + BATCH]).argmax(1) == ys[i : i + BATCH]).sum()
            )
            model.train_on_batch(xs[i : i + BATCH], ys[i : i + BATCH])
        print(
            f"{name:28s} accuracy over the {AFTER:,} records after the change: {hits / AFTER:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
