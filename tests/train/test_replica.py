"""The executor side's model plumbing, on real Keras models: flat weights and the warm-up trace."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.train import zoo
from pipeline.train.model import FlatGradients, FlatWeights, ModelSpec, get_flat, set_flat
from pipeline.train.partition import _labels
from pipeline.train.replica import Replica, prime, replica


def _compiled(build, optimizer="adam"):  # type: ignore[no-untyped-def]
    model = build()
    spec = ModelSpec.from_model(model, optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return spec.build(), spec


def _entry(model, spec) -> Replica:  # type: ignore[no-untyped-def]
    return Replica(model, "job", FlatWeights(model, spec.shapes), spec)


@pytest.mark.parametrize("build", [zoo.mnist_cnn, zoo.higgs_mlp])
def test_flat_weights_match_the_numpy_path(build) -> None:  # type: ignore[no-untyped-def]
    model, spec = _compiled(build)
    flat = FlatWeights(model, spec.shapes)
    assert np.array_equal(flat.get(), get_flat(model))
    new = np.random.default_rng(0).standard_normal(spec.size).astype(np.float32)
    flat.set(new)
    assert np.array_equal(get_flat(model), new)
    set_flat(model, -new, spec.shapes)  # and it sees changes made another way
    assert np.array_equal(flat.get(), -new)
    with pytest.raises(ConfigError, match=f"Expected {spec.size} weights"):
        flat.set(new[:-1])


@pytest.mark.slow  # a model traced in a child process: the quick tier's budget
def test_flat_weights_leave_no_autograph_file_behind(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Autograph writes each function it converts to a temporary file that only a clean exit
    removes; a Spark Python worker exits without one, so every replica would leave two
    behind. The flat weights' functions branch on no tensor and are not converted. In a
    process of its own that exits as a worker does: autograph converts a function once per
    process, so this one's earlier tests could hide a conversion."""
    script = (
        "import os, numpy as np\n"
        "from pipeline.train import zoo\n"
        "from pipeline.train.model import FlatWeights, ModelSpec\n"
        "spec = ModelSpec.from_model(zoo.higgs_mlp(), optimizer='adam', "
        "loss='sparse_categorical_crossentropy')\n"
        "model = spec.build()\n"
        "flat = FlatWeights(model, spec.shapes)\n"
        "flat.set(flat.get() + 1)\n"
        "os._exit(0)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert not list(tmp_path.glob("__autograph_generated_file*"))


def _tracings(fn, depth: int = 0) -> int:  # type: ignore[no-untyped-def]
    """How many times the tf.functions inside Keras's train function have been traced."""
    total = 0
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        if hasattr(value, "experimental_get_tracing_count"):
            total += value.experimental_get_tracing_count()
        elif callable(value) and depth < 3:
            total += _tracings(value, depth + 1)
    return total


def test_prime_traces_training_once_and_leaves_no_optimizer_state() -> None:
    model, spec = _compiled(zoo.higgs_mlp)
    prime(_entry(model, spec), 64)
    opt = model.optimizer
    assert int(opt.iterations.numpy()) == 0
    assert all(not np.any(v.numpy()) for v in opt.variables if "learning_rate" not in v.path)
    traced = _tracings(model.train_function)
    assert traced > 0
    x = np.random.default_rng(1).standard_normal((64, 28)).astype(np.float32)
    y = _labels(spec.loss, (x[:, 0] > 0).astype(np.int64), 2)  # as train_partition passes them
    for n in (64, 64, 17, 64, 5):  # full batches and a partition's short last one
        model.train_on_batch(x[:n], y[:n])
    assert _tracings(model.train_function) == traced
    assert int(opt.iterations.numpy()) == 5


def test_a_primed_replica_is_cached_per_model() -> None:
    _, spec = _compiled(zoo.higgs_mlp)
    first, fresh = replica(spec, job="a", prime_batch=32)
    again, fresh_again = replica(spec, job="a", prime_batch=32)
    assert fresh and not fresh_again and first is again and first.model is again.model


def test_a_spec_with_an_optimizer_config_keeps_its_fingerprint_and_its_cached_replica() -> None:
    """Proves: building a spec whose optimizer is a config dict (the default table model's
    Adam at its own rate) leaves its fingerprint as it was, so each task's copy of the spec
    finds the replica built before (Keras rewrote the dict in place: every task rebuilt it)."""
    from pipeline.jobs.run_config import RunConfig
    from pipeline.jobs.run_training import algorithm_of

    optimizer = algorithm_of(RunConfig(topic="t", format="json", label="y")).worker_optimizer
    assert isinstance(optimizer, dict)
    spec = ModelSpec.from_model(
        zoo.table_mlp(3, 2), optimizer=optimizer, loss="sparse_categorical_crossentropy"
    )
    before = spec.fingerprint
    first, fresh = replica(spec, job="t")
    assert spec.fingerprint == before
    task_copy = ModelSpec.from_json(spec.to_json())  # what the next task unpickles
    again, fresh_again = replica(task_copy, job="t")
    assert fresh and not fresh_again and again is first


def test_prime_works_for_one_hot_targets() -> None:
    model = zoo.higgs_mlp()
    spec = ModelSpec.from_model(model, optimizer="adam", loss="categorical_crossentropy")
    replica_model = spec.build()
    prime(_entry(replica_model, spec), 32)
    traced = _tracings(replica_model.train_function)
    assert traced > 0  # else the equality below would hold with nothing counted
    y = _labels(spec.loss, np.array([0, 1, 1], np.int32), 2)
    assert y.shape == (3, 2) and y.dtype == np.float32
    replica_model.train_on_batch(np.ones((3, 28), np.float32), y)
    assert _tracings(replica_model.train_function) == traced


@pytest.mark.parametrize("build", [zoo.mnist_cnn, zoo.higgs_mlp])
def test_flat_gradients_are_what_a_unit_sgd_step_subtracts(build) -> None:  # type: ignore[no-untyped-def]
    # SGD with learning rate 1 moves the weights by exactly minus the gradient.
    model, spec = _compiled(
        build, optimizer={"class_name": "SGD", "config": {"learning_rate": 1.0}}
    )
    twin = spec.build()
    twin.set_weights(model.get_weights())
    shape = model.inputs[0].shape[1:]
    rng = np.random.default_rng(2)
    x = rng.standard_normal((16, *shape)).astype(np.float32)
    y = rng.integers(0, spec.shapes[-1][-1], 16).astype(np.int32)
    grads = FlatGradients(model, spec)
    grad, loss, acc = grads(x, y)
    before = get_flat(twin)
    twin_loss = twin.train_on_batch(x, y)[0]
    np.testing.assert_allclose(grad, before - get_flat(twin), rtol=1e-3, atol=1e-6)
    assert loss == pytest.approx(twin_loss, rel=1e-5) and 0 <= acc <= 1
    assert np.array_equal(get_flat(model), before)  # computing a gradient trains nothing
    for n in (16, 3, 1):  # one trace serves every batch size
        grads(x[:n], y[:n])
    assert grads._step.experimental_get_tracing_count() == 1


def test_weights_that_gradients_do_not_train_get_no_gradient() -> None:
    import keras

    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(2, activation="softmax"),
        ]
    )
    spec = ModelSpec.from_model(model, optimizer="adam", loss="sparse_categorical_crossentropy")
    assert spec.trainable == (
        True,
        True,
        True,
        True,
        False,
        False,
        True,
        True,
    )  # BN's moving mean and variance
    replica_model = spec.build()
    grad, _, _ = FlatGradients(replica_model, spec)(
        np.ones((5, 4), np.float32), np.zeros(5, np.int32)
    )
    sizes = [int(np.prod(s)) for s in spec.shapes]
    stats = slice(sum(sizes[:4]), sum(sizes[:6]))
    assert not np.any(grad[stats]) and np.any(grad[: stats.start])


def test_a_block_trains_shuffled_and_its_replay_trains_alike(mnist) -> None:  # type: ignore[no-untyped-def]
    import uuid

    import keras

    from pipeline import codec
    from pipeline.ingest import microbatch as stream
    from pipeline.train import algorithms
    from pipeline.train.handler import TrainHandler
    from pipeline.train.partition import ServerInfo
    from pipeline.train.server import parameter_server

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    spec = ModelSpec.from_model(model, optimizer="adam", loss="sparse_categorical_crossentropy")
    start, train, n = get_flat(model), mnist.load("train"), 512
    algo = algorithms.get("downpour", num_workers=1, batch_size=64, communication_window=1000)

    def trained(first_offset: int) -> np.ndarray:
        """The center after one block of the same records, at Kafka offsets from
        ``first_offset``."""
        block = stream.Block(
            "t",
            0,
            train.x[:n],
            train.y[:n],
            np.arange(n),
            np.arange(first_offset, first_offset + n),
            np.zeros(n),
            codec.MNIST,
        )
        with parameter_server(algo, spec, start, host="127.0.0.1") as server:
            handler = TrainHandler(
                spec=spec,
                algorithm=algorithms.serialize(algo),
                job=uuid.uuid4().hex,
                server=ServerInfo(server.host, server.port, server.secret),
                seed=7,
            )
            assert handler.process(block).records == n
            return server.snapshot()[0]

    first = trained(0)
    assert not np.array_equal(first, start)
    # A replay of the block (same offsets, after a crash) trains in the same order...
    assert np.array_equal(trained(0), first)
    # ...and the order is a shuffle that the block's offsets choose, not the stream's order.
    assert not np.array_equal(trained(n), first)
