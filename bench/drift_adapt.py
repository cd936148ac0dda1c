"""Which reaction to an abrupt change recovers best: what ``--on-drift adapt`` does was
chosen by this measurement, and what it could do next is measured here too (docs/drift.md
has its figures).

A Keras MLP (784-256-10, Adam at 0.001, mini-batches of 128) learns MNIST for 30,000 records;
then the labels are permuted, and each arm goes on from the same weights and optimizer state
for 20,000 records, in micro-batches of 2,000 as a run trains them. As in a run, the drift is
found at the end of the first micro-batch after the change, and a reaction starts there:

- a raise of the learning rate by a factor for a number of records (what ``adapt`` does);
- Adam's moments reset;
- the drift's micro-batch replayed a number of times at once (its records are the only ones
  of the new concept there are then);
- each later micro-batch trained in more passes than one for a number of records (its
  prequential score taken in the first, on weights that have not seen it).

Its figures: the prequential accuracy (each mini-batch scored before it trains) over the
20,000 records, and ``share``, the gain over doing nothing as a share of the most any
reaction could gain (every record after the drift's micro-batch right), as bench/drift.py's
``recovery_share``.

    .venv/bin/python bench/drift_adapt.py      # about a minute on 2 cores
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PRE, AFTER, BATCH, LR, MICRO = 30_000, 20_000, 128, 1e-3, 2_000


class Arm(NamedTuple):
    """A reaction, from the end of the drift's micro-batch."""

    factor: float = 1.0  # the learning rate's raise
    records: int = 0  # for how many records (the raise, and the passes)
    reset: bool = False  # Adam's moments and step count reset
    replay: int = 0  # times the drift's micro-batch is trained again, at once
    passes: int = 1  # passes over each micro-batch within ``records``


ARMS = {
    "nothing (alert)": Arm(),
    "reset moments": Arm(reset=True),
    "rate x3 for 5,000": Arm(3.0, 5_000),
    "rate x10 for 2,000": Arm(10.0, 2_000),
    "rate x5 for 5,000 (adapt before)": Arm(5.0, 5_000),
    "replay x4": Arm(replay=4),
    "4 passes for 5,000": Arm(records=5_000, passes=4),
    "4 passes, rate x5 for 5,000 (adapt)": Arm(5.0, 5_000, passes=4),
    "replay x8, rate x5 for 5,000": Arm(5.0, 5_000, replay=8),
    "replay x4, 4 passes, rate x5 for 5,000": Arm(5.0, 5_000, replay=4, passes=4),
    "replay x8, 4 passes, rate x5 for 5,000": Arm(5.0, 5_000, replay=8, passes=4),
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
    nothing = None
    for name, arm in ARMS.items():
        model.set_weights(weights)
        for var, value in zip(model.optimizer.variables, state, strict=True):
            var.assign(value)
        rng = np.random.default_rng(1)
        hits = first = 0
        for start in range(0, AFTER, MICRO):
            bx, by = xs[start : start + MICRO], ys[start : start + MICRO]
            within = MICRO <= start < MICRO + arm.records
            model.optimizer.learning_rate.assign(LR * (arm.factor if within else 1.0))
            for p in range(arm.passes if within else 1):
                # The first pass in the stream's order, scored; the others shuffled.
                order = np.arange(len(by)) if p == 0 else rng.permutation(len(by))
                for i in range(0, len(by), BATCH):
                    pick = order[i : i + BATCH]
                    if p == 0:
                        hits += int((model.predict_on_batch(bx[pick]).argmax(1) == by[pick]).sum())
                    model.train_on_batch(bx[pick], by[pick])
            if start == 0:  # the drift is found here: the reaction starts
                first = hits
                if arm.reset:
                    reset_optimizer(model)
                model.optimizer.learning_rate.assign(LR * arm.factor)
                for _ in range(arm.replay):
                    order = rng.permutation(len(by))
                    for i in range(0, len(by), BATCH):
                        model.train_on_batch(bx[order[i : i + BATCH]], by[order[i : i + BATCH]])
        accuracy, ceiling = hits / AFTER, (first + AFTER - MICRO) / AFTER
        nothing = accuracy if nothing is None else nothing
        share = (accuracy - nothing) / (ceiling - nothing)
        print(
            f"{name:40s} accuracy over the {AFTER:,} records after the change: {accuracy:.4f} "
            f"share={share:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
