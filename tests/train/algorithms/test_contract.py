"""Every algorithm in the registry passes the same contract, on real MNIST."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from pipeline import codec
from pipeline.errors import ConfigError
from pipeline.jobs.trainer import Trainer
from pipeline.train import algorithms, ps
from pipeline.train.model import ModelSpec
from pipeline.train.server import parameter_server

NAMES = algorithms.NAMES
#: The default algorithm in the quick tier; every other on real MNIST in the full tier (each
#: trains a model for seconds, and the quick tier's budget is four minutes).
QUICK_NAMES = [n if n == "sync" else pytest.param(n, marks=pytest.mark.slow) for n in NAMES]


def _workers(name: str, wanted: int) -> int:
    return 1 if name == "single" else wanted


@pytest.fixture(scope="module")
def mnist_small(mnist):  # type: ignore[no-untyped-def]
    train = mnist.load("train")
    return codec.MNIST.to_model_input(train.x[:4000]).reshape(4000, 784), train.y[:4000]


def _server(algo: algorithms.Algorithm, start: np.ndarray, shards: int, sync_workers: int = 0):  # type: ignore[no-untyped-def]
    """Today's one server in this process, or ``shards`` shard processes over the same buffer."""
    if shards == 1:
        return ps.ParameterServer(
            start,
            secret=b"s",
            rule=algo.apply,
            keep_pulled=algo.keep_pulled,
            sync_workers=sync_workers,
        )
    algo = algorithms.get(algorithms.serialize(algo), num_workers=max(1, sync_workers))
    return parameter_server(
        algo,
        ModelSpec("{}", "adam", "mse", ((start.size,),)),
        start,
        host="127.0.0.1",
        secret=b"s",
        shards=shards,
        straggler_wait=0.0,
    )  # rounds of every worker, as above


def _client(server, worker: int, size: int):  # type: ignore[no-untyped-def]
    return ps.connect(
        server.address, getattr(server, "shards", ()), secret=b"s", worker=worker, size=size
    )


def _mlp(seed: int = 0):  # type: ignore[no-untyped-def]
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )


@pytest.mark.parametrize("name", NAMES)
def test_config_round_trip(name: str) -> None:
    algo = algorithms.get(name, batch_size=17, seed=5)
    config = algorithms.serialize(algo)
    again = algorithms.get(json.loads(json.dumps(config)))
    assert again == algo and type(again) is type(algo)
    assert again.batch_size == 17 and again.seed == 5


@pytest.mark.slow  # every algorithm trained twice: the quick tier's budget
@pytest.mark.parametrize("name", NAMES)
def test_determinism_with_a_seed_on_one_worker(name: str, mnist_small) -> None:  # type: ignore[no-untyped-def]
    x, y = mnist_small
    weights = []
    for _ in range(2):
        t = Trainer(_mlp(), algorithm=name, num_workers=1, batch_size=64, seed=11)
        weights.append([w.copy() for w in t.train(x[:1500], y[:1500]).get_weights()])
    assert all(np.array_equal(a, b) for a, b in zip(*weights, strict=True))
    # and the run really trained: the weights moved from the initial model
    assert not all(
        np.array_equal(a, b) for a, b in zip(weights[0], _mlp().get_weights(), strict=True)
    )


@pytest.mark.parametrize("shards", [1, 2])  # one server in the process, or two shard processes
@pytest.mark.parametrize("name", QUICK_NAMES)
def test_loss_falls_on_a_short_real_mnist_run(name: str, shards: int, mnist_small) -> None:  # type: ignore[no-untyped-def]
    import keras

    x, y = mnist_small
    model = _mlp()
    before = (
        keras.losses.sparse_categorical_crossentropy(y, model.predict(x, verbose=0)).numpy().mean()
    )
    # A short window: elastic averaging moves the center by alpha per exchange, and a
    # short run has few exchanges at the default window of 32.
    t = Trainer(
        model,
        algorithm=name,
        num_workers=_workers(name, 2),
        batch_size=32,
        communication_window=4,
        seed=1,
        ps_shards=shards,
    )
    trained = t.train(x, y)
    after = (
        keras.losses.sparse_categorical_crossentropy(y, trained.predict(x, verbose=0))
        .numpy()
        .mean()
    )
    assert after < 0.7 * before, f"{name}: loss {before:.3f} -> {after:.3f}"
    assert all(r.loss_last < r.loss_first for r in t.results)
    assert sum(r.records for r in t.results) == len(y)
    assert t.server_stats["clock"] > 0
    # Every shard applied every push. Synchronous rounds close as pushes come, so two
    # shards may group the same pushes into different rounds (and clocks): the pushes agree.
    each = t.server_stats.get("shards", [t.server_stats])
    assert [s["pushes_applied"] for s in each] == [each[0]["pushes_applied"]] * shards
    assert each[0]["pushes_applied"] > 0
    if not algorithms.get(name).synchronous:
        assert [s["clock"] for s in each] == [t.server_stats["clock"]] * shards


@pytest.mark.parametrize("name", QUICK_NAMES)
def test_loss_falls_with_bfloat16_on_the_wire(name: str, mnist_small) -> None:  # type: ignore[no-untyped-def]
    """Proves: every algorithm still learns when its deltas and weights cross TCP as
    bfloat16 (the center kept in float32), and the exchanges did go over TCP narrowed."""
    import keras

    x, y = mnist_small
    model = _mlp()
    before = (
        keras.losses.sparse_categorical_crossentropy(y, model.predict(x, verbose=0)).numpy().mean()
    )
    t = Trainer(
        model,
        algorithm=name,
        num_workers=_workers(name, 2),
        batch_size=32,
        communication_window=4,
        seed=1,
        wire_dtype="bfloat16",
        shared_memory=False,
    )
    trained = t.train(x, y)
    after = (
        keras.losses.sparse_categorical_crossentropy(y, trained.predict(x, verbose=0))
        .numpy()
        .mean()
    )
    assert after < 0.7 * before, f"{name}: loss {before:.3f} -> {after:.3f}"
    assert t.server_stats["clock"] > 0 and t.server_stats["shared_memory"] == 0
    assert all(not r.shared_memory and r.wire_dtype == "bfloat16" for r in t.results)


#: The center after a worker pulls [1, 2, 3] and pushes [0.5, -1, 2] twice without pulling
#: again (so its second push is one update stale), worked out by hand per rule.
_START, _DELTA = [1.0, 2.0, 3.0], [0.5, -1.0, 2.0]
_PLAIN = [2.0, 0.0, 7.0]  # center += delta, twice
_EXPECTED = {
    "single": _PLAIN,
    "downpour": _PLAIN,
    "agn": _PLAIN,
    "aeasgd": _PLAIN,
    "eamsgd": _PLAIN,
    "averaging": _PLAIN,  # a round of one worker: its mean is its push
    # ADAG: the second push is divided by 1 + (center - pulled)^2 / lr = 1 + delta^2 = [1.25, 2, 5]
    "adag": [1.0 + 0.5 + 0.4, 2.0 - 1.0 - 0.5, 3.0 + 2.0 + 0.4],
    # DynSGD: the second push, staleness 1, counts half
    "dynsgd": [1.0 + 0.75, 2.0 - 1.5, 3.0 + 3.0],
    # sync: Adam on the server (lr 0.001); with a constant gradient each step moves -lr * sign(g)
    "sync": [0.998, 2.002, 2.998],
}


def test_every_algorithm_has_a_hand_computed_rule() -> None:
    assert sorted(_EXPECTED) == sorted(NAMES)


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("name", NAMES)
def test_the_server_applies_each_rule_as_computed_by_hand(name: str, shards: int) -> None:
    algo = algorithms.get(name)
    delta = np.array(_DELTA, np.float32)
    with (
        _server(
            algo, np.array(_START, np.float32), shards, sync_workers=1 if algo.synchronous else 0
        ) as server,
        _client(server, 0, 3) as c,
    ):
        c.pull()
        c.push(delta)
        c.push(delta)
        got = c.pull().copy()
    np.testing.assert_allclose(got, _EXPECTED[name], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("name", NAMES)
def test_concurrent_clients_lose_no_update(name: str, shards: int) -> None:
    algo = algorithms.get(name)
    workers, pushes, n = 4, 25, 300
    sync = workers if algo.synchronous else 0
    with _server(algo, np.zeros(n, np.float32), shards, sync_workers=sync) as server:

        def work(w: int) -> None:
            with _client(server, w, n) as c:
                c.pull()
                for _ in range(pushes):
                    c.push_pull(np.ones(n, np.float32))

        threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = server.stats()
        center = server.weights()
    assert sum(stats["staleness"].values()) == workers * pushes
    if (
        algo.pushes_gradients
    ):  # each round steps the server's optimizer once with the mean gradient, 1
        twin, expected = algorithms.get(name), np.zeros(n, np.float32)
        for _ in range(pushes):
            twin.apply(expected, np.ones(n, np.float32))
        assert stats["clock"] == pushes and np.array_equal(center, expected) and np.all(center < 0)
    elif algo.synchronous:
        assert stats["clock"] == pushes and np.allclose(
            center, pushes
        )  # each round adds the mean, 1
    else:
        assert stats["clock"] == workers * pushes
    if (
        type(algo).apply is algorithms.Algorithm.apply and not algo.synchronous
    ):  # plain center += delta
        assert np.array_equal(center, np.full(n, workers * pushes, np.float32))


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"name": "adag", "config": {"communication_window": 0}}, "communication_window"),
        ({"name": "aeasgd", "config": {"rho": 500.0}}, "learning_rate \\* rho"),
        ({"name": "single", "config": {"num_workers": 2}}, "exactly one worker"),
        ({"name": "nope"}, "Unknown algorithm 'nope'"),
        ({"name": "downpour", "config": {"colour": 1}}, "Bad settings"),
    ],
)
def test_bad_settings_are_clear_errors(bad: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=match):
        algorithms.get(bad)


@pytest.mark.parametrize("overlap", [False, True])
def test_sync_computes_each_gradient_on_the_newest_center_unless_it_overlaps(
    overlap: bool, mnist_small
) -> None:  # type: ignore[no-untyped-def]
    """Proves: by default synchronous SGD's gradients are computed on the center they are
    applied to (staleness 0 on every push, as one process); with ``overlap`` each push
    travels while the next gradient computes, and lands one round late (staleness 1)."""
    x, y = mnist_small
    t = Trainer(
        _mlp(),
        algorithm={"name": "sync", "config": {} if not overlap else {"overlap": True}},
        num_workers=1,
        batch_size=64,
        seed=3,
    )
    t.train(x[:1000], y[:1000])
    staleness = [s for r in t.results for s in r.staleness]
    assert len(staleness) > 10
    assert set(staleness) == ({0, 1} if overlap else {0}), sorted(set(staleness))
