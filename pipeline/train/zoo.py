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


def for_dataset(name: str) -> Any:
    """A fresh default model for dataset ``name`` (``table:WIDTH:CLASSES[:CENTER:SPREAD]`` for
    a user's table)."""
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
