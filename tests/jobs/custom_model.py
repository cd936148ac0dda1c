"""A user's subclassed Keras model, in a module the workers can import."""

from __future__ import annotations

from typing import Any

import keras


@keras.saving.register_keras_serializable(package="streamtrain_tests")
class Tiny(keras.Model):
    """Two dense layers; serializable through get_config."""

    def __init__(self, units: int = 16, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(units, activation="relu")
        self.out = keras.layers.Dense(2, activation="softmax")

    def call(self, x: Any) -> Any:
        return self.out(self.hidden(x))

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "units": self.units}
