"""A user's model file for `streamtrain run --model tests/jobs/user_model.py:build`."""

import keras


def build() -> keras.Model:
    return keras.Sequential(
        [
            keras.Input((28,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(2, activation="softmax"),
        ]
    )


def not_a_model() -> int:
    return 3


def broken() -> keras.Model:
    raise ValueError("no layer called Dense3000")
