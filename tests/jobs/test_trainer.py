"""The batch API on real data: any Keras model, numpy or a Spark DataFrame, and dist-keras's CNN."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import codec
from pipeline.errors import ConfigError
from pipeline.jobs.trainer import Trainer
from pipeline.train import zoo as models
from pipeline.train.evaluation import roc_auc
from producers import datasets
from tests.jobs import custom_model


@pytest.fixture(scope="module")
def higgs(data_dir):  # type: ignore[no-untyped-def]
    h = datasets.get("higgs", data_dir=data_dir)
    return h.load("train"), h.load("test")


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_functional_and_subclassed_models_train(higgs) -> None:  # type: ignore[no-untyped-def]
    import keras

    train, test = higgs
    inputs = keras.Input((28,))
    functional = keras.Model(
        inputs,
        keras.layers.Dense(2, activation="softmax")(
            keras.layers.Dense(32, activation="relu")(inputs)
        ),
    )

    subclassed = custom_model.Tiny()
    subclassed(np.zeros((1, 28), np.float32))

    def loss(net) -> float:  # type: ignore[no-untyped-def]
        return float(
            keras.losses.sparse_categorical_crossentropy(train.y, net.predict(train.x, verbose=0))
            .numpy()
            .mean()
        )

    for net in (functional, subclassed):
        before = loss(net)
        t = Trainer(net, algorithm="downpour", num_workers=1, batch_size=64, num_epoch=2, seed=0)
        trained = t.train(train.x, train.y)
        assert trained is net
        assert t.results[0].loss_last < t.results[0].loss_first
        assert loss(trained) < before - 0.02, type(net).__name__


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_spark_dataframe_with_two_workers(spark, higgs) -> None:  # type: ignore[no-untyped-def]
    import pandas as pd

    train, test = higgs
    df = spark.createDataFrame(
        pd.DataFrame({"features": list(train.x), "label": train.y.astype(int)})
    )
    t = Trainer(
        models.higgs_mlp(), algorithm="adag", num_workers=2, batch_size=64, num_epoch=3, seed=0
    )
    trained = t.train(df)
    assert sorted(r.worker for r in t.results) == [0, 1]
    assert sum(r.records for r in t.results) == 3 * len(train.y)
    # An untrained model scores ~0.5; 7,000 HIGGS rows give ~0.65-0.70 after 3 epochs.
    assert roc_auc(test.y, trained.predict(test.x, verbose=0)[:, 1]) > 0.6
    assert all(r.loss_last < r.loss_first for r in t.results)
    # Spark reuses its Python workers: a second job finds the cached replicas.
    t.train(df.limit(1000))
    assert not all(r.fresh_replica for r in t.results)


def test_missing_columns_and_bad_inputs_are_clear(spark) -> None:  # type: ignore[no-untyped-def]
    df = spark.createDataFrame([(1.0, 0)], ["x", "y"])
    t = Trainer(models.higgs_mlp(), num_workers=1, algorithm="single")
    with pytest.raises(ConfigError, match=r"Expected columns \['features', 'label'\]"):
        t.train(df)
    with pytest.raises(ConfigError, match="as many labels"):
        t.train(np.zeros((3, 28)), np.zeros(2))
    with pytest.raises(ConfigError, match="num_epoch"):
        Trainer(models.higgs_mlp(), num_epoch=0)


@pytest.mark.slow
def test_dist_keras_mnist_cnn_reaches_95_percent_with_two_workers(mnist) -> None:  # type: ignore[no-untyped-def]
    """Proves: the batch API trains dist-keras's MNIST CNN on two local workers (DOWNPOUR,
    window 5) above 95% test accuracy.

    Slow: two epochs of MNIST's 60,000 training images through that 1M-weight CNN on CPU, in two
    spawned worker processes that each load TensorFlow and compile a replica; one epoch ended as
    low as 0.935 on 2 cores, so two are the least that clear 0.95."""
    train, test = mnist.load("train"), mnist.load("test")
    net = models.mnist_cnn()
    assert net.count_params() == 1_048_853
    # Two epochs: where one ends depends on the two workers' timing (asynchronous pushes),
    # 0.935 to 0.978 in seven runs on 2 cores; two ended at 0.981 and 0.982.
    t = Trainer(
        net,
        algorithm="downpour",
        num_workers=2,
        batch_size=128,
        communication_window=5,
        seed=0,
        num_epoch=2,
    )
    trained = t.train(codec.MNIST.to_model_input(train.x), train.y)
    accuracy = float(
        (trained.predict(codec.MNIST.to_model_input(test.x), verbose=0).argmax(1) == test.y).mean()
    )
    assert accuracy > 0.95, accuracy


def test_non_finite_features_are_refused_before_training() -> None:
    """The batch API once trained silently on NaN (80% of a kernel became NaN); now one line,
    and the default algorithm is the run's (synchronous SGD)."""
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
    trainer = Trainer(model, num_workers=1)
    assert trainer.algorithm.name == "sync"
    x = np.array([[1.0, 2.0], [np.nan, 0.0]], np.float32)
    with pytest.raises(
        ConfigError, match="Expected finite features. Received 1 NaN or infinite value"
    ):
        trainer.train(x, np.array([0, 1]))
