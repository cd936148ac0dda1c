"""Users' models for the penguins table (12 encoded columns, 3 classes)."""

import keras


def wrong_outputs() -> keras.Model:
    """5 output units for 3 classes: refused before anything trains."""
    return keras.Sequential([keras.Input((12,)), keras.layers.Dense(5, activation="softmax")])


def compiled_frozen() -> keras.Model:
    """Compiled by its user with SGD at learning rate 0: the run must train with exactly that."""
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=0.0), loss="sparse_categorical_crossentropy"
    )
    return model
