"""Every built-in dataset has a built-in model, and the model fits the dataset's records."""

from __future__ import annotations

import pytest

from pipeline import codec
from pipeline.errors import ConfigError
from pipeline.train import zoo
from producers import datasets


def test_every_builtin_dataset_has_a_default_model() -> None:
    assert sorted(zoo.DEFAULTS) == sorted(datasets.BUILTIN)


@pytest.mark.parametrize("name", datasets.BUILTIN)
def test_the_default_model_takes_the_datasets_records(name: str) -> None:
    schema = codec.SCHEMAS[name]
    model = zoo.for_dataset(name)
    assert tuple(model.inputs[0].shape[1:]) == schema.input_shape
    assert model.outputs[0].shape[-1] == schema.num_classes


def test_an_unknown_dataset_says_what_to_do() -> None:
    with pytest.raises(ConfigError, match="--model FILE.py:BUILD_FN"):
        zoo.for_dataset("nope")
