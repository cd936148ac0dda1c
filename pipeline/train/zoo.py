"""The model zoo: what ``streamtrain run`` trains when the user brings no model.

A new built-in dataset adds its model here (and its reader to
:mod:`producers.datasets`); ``tests/train/test_zoo.py`` checks that every built-in
dataset has one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeline.errors import ConfigError


def mnist_cnn() -> Any:
    """dist-keras's MNIST CNN (1,048,853 weights), from the Keras MNIST example."""
    import keras

    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(32, (3, 3), activation="relu"),
            keras.layers.Conv2D(32, (3, 3), activation="relu"),
            keras.layers.MaxPooling2D((2, 2)),
            keras.layers.Flatten(),
            keras.layers.Dense(225, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="mnist_cnn",
    )


def higgs_mlp() -> Any:
    """A HIGGS classifier: 28 features, three hidden layers, 2 classes."""
    import keras

    return keras.Sequential(
        [
            keras.Input((28,)),
            keras.layers.Dense(300, activation="relu"),
            keras.layers.Dense(300, activation="relu"),
            keras.layers.Dense(300, activation="relu"),
            keras.layers.Dense(2, activation="softmax"),
        ],
        name="higgs_mlp",
    )


#: dataset name -> the function that builds its default model.
DEFAULTS: dict[str, Callable[[], Any]] = {
    "mnist": mnist_cnn,
    "fashion-mnist": mnist_cnn,
    "higgs": higgs_mlp,
}


def table_mlp(width: int, classes: int, center: float = 0.0, spread: float = 1.0) -> Any:
    """A user's table: an MLP sized from its encoded width, ``classes`` softmax outputs; for
    a numeric target (``classes`` 0) one linear output in the target's units, scaled by its
    ``center`` and ``spread`` so that training starts at the mean, not at 0."""
    import keras

    hidden = min(256, max(32, 4 * width))
    head = (
        [keras.layers.Dense(classes, activation="softmax")]
        if classes
        else [keras.layers.Dense(1), keras.layers.Rescaling(scale=spread, offset=center)]
    )
    return keras.Sequential(
        [
            keras.Input((width,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(max(16, hidden // 2), activation="relu"),
            *head,
        ],
        name="table_mlp",
    )


def table_ids(
    dense: int, classes: int, dims: list[int], center: float = 0.0, spread: float = 1.0
) -> Any:
    """A table with ID features: its input is the ``dense`` other columns, then each ID's row
    (``dims``). The table MLP over all of it, beside the dot product of every two rows of one
    size (a factorization machine's interactions: what an MLP learns poorly), into the output.

    The rows are cut out of the input by cropping (stock Keras layers without weights, so
    the model loads anywhere, and every weight it has is one that gradients train: no
    exchange has to carry constants along).
    """
    import keras

    width = dense + sum(dims)
    inputs = keras.Input((width,))
    hidden = min(256, max(32, 4 * width))
    deep = keras.layers.Dense(hidden, activation="relu")(inputs)
    deep = keras.layers.Dense(max(16, hidden // 2), activation="relu")(deep)
    column = keras.layers.Reshape((width, 1))(inputs)
    rows, at = [], dense
    for i, dim in enumerate(dims):
        cut = keras.layers.Cropping1D((at, width - at - dim), name=f"id_row_{i}")(column)
        rows.append((dim, keras.layers.Reshape((dim,))(cut)))
        at += dim
    dots = [
        keras.layers.Dot(axes=1)([a, b])
        for i, (da, a) in enumerate(rows)
        for db, b in rows[i + 1 :]
        if da == db
    ]
    joined = keras.layers.Concatenate()([deep, *dots]) if dots else deep
    out = (
        keras.layers.Dense(classes, activation="softmax")(joined)
        if classes
        else keras.layers.Rescaling(scale=spread, offset=center)(keras.layers.Dense(1)(joined))
    )
    return keras.Model(inputs, out, name="table_ids")


def for_dataset(name: str) -> Any:
    """A fresh default model for dataset ``name`` (``table:WIDTH:CLASSES[:CENTER:SPREAD]`` for
    a user's table; ``table_ids:DENSE:CLASSES:DIM,DIM..[:CENTER:SPREAD]`` for one with ID
    features)."""
    if name.startswith("table_ids:"):
        _, dense, classes, dims, *scale = name.split(":")
        return table_ids(
            int(dense),
            int(classes),
            [int(d) for d in dims.split(",")],
            *(float(v) for v in scale),
        )
    if name.startswith("table:"):
        _, width, classes, *scale = name.split(":")
        return table_mlp(int(width), int(classes), *(float(v) for v in scale))
    try:
        return DEFAULTS[name]()
    except KeyError:
        raise ConfigError(
            f"No built-in model for dataset {name!r}; expected one of {sorted(DEFAULTS)}, "
            "or pass --model FILE.py:BUILD_FN / FILE.keras."
        ) from None
