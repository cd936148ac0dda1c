"""A sharded parameter server (``--ps-shards``): real shard processes on loopback."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import ConfigError, StreamtrainError
from pipeline.jobs.trainer import Trainer
from pipeline.serve.weights import LiveWeights
from pipeline.train import algorithms, ps
from pipeline.train.model import ModelSpec
from pipeline.train.ps.protocol import task_key
from pipeline.train.server import parameter_server

#: Three weight arrays, 2,000 weights: two shards cut inside the first array.
SPEC = ModelSpec("{}", "adam", "mse", ((40, 40), (300,), (100,)))
N = SPEC.size


def _sync(workers: int = 1) -> algorithms.Algorithm:
    """Synchronous SGD: Adam on the server, whose state (per weight, and a step count) is
    cut between the shards."""
    return algorithms.get(
        "sync",
        num_workers=workers,
        worker_optimizer={"class_name": "Adam", "config": {"learning_rate": 0.01}},
    )


def _deltas(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(N).astype(np.float32) for _ in range(n)]


def _push(server, deltas: list[np.ndarray]) -> np.ndarray:  # type: ignore[no-untyped-def]
    with ps.connect(
        server.address, getattr(server, "shards", ()), secret=server.secret, worker=0, size=N
    ) as c:
        c.pull()
        for d in deltas:
            center = c.push_pull(d)
        return center.copy()


def test_a_sharded_checkpoint_is_one_servers_and_resumes_exactly() -> None:
    """Proves: two shards apply the same pushes as one server bit for bit (center, clock and
    Adam's state, joined from the shards' slices into one checkpoint), and a sharded server
    started from that checkpoint (or restored to it while running) goes on exactly as one
    server does; the shard processes are gone once it stops."""
    start = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    first, then = _deltas(1, 6), _deltas(2, 4)
    with parameter_server(_sync(), SPEC, start, host="127.0.0.1") as one:
        _push(one, first)
        saved = one.checkpoint()
        _push(one, then)
        expected = one.checkpoint()
    with parameter_server(_sync(), SPEC, start, host="127.0.0.1", shards=2) as sharded:
        assert [(a, b) for _, _, a, b in sharded.shards] == [(0, 992), (992, N)]
        _push(sharded, first)
        cut = sharded.checkpoint()
        _push(sharded, _deltas(3, 2))  # moves on, then goes back to the cut
        sharded.restore(*cut)
        _push(sharded, then)
        restored = sharded.checkpoint()
        procs = [proc for proc, _ in sharded._children.procs]
    assert all(proc.poll() is not None for proc in procs)  # stopped, by pid
    with parameter_server(
        _sync(), SPEC, saved[0], host="127.0.0.1", shards=2, clock=saved[1], optimizer=saved[2]
    ) as resumed:
        _push(resumed, then)
        again = resumed.checkpoint()
    for got in (cut, saved):
        assert np.array_equal(got[0], saved[0]) and got[1] == saved[1] == 6
    assert sorted(cut[2]) == sorted(saved[2]) == ["iterations", "m", "v"]
    assert all(np.array_equal(cut[2][k], saved[2][k]) for k in saved[2])
    for got in (restored, again):
        assert np.array_equal(got[0], expected[0]) and got[1] == expected[1] == 10
        assert all(np.array_equal(got[2][k], expected[2][k]) for k in expected[2])


def test_a_raised_learning_rate_reaches_every_shard() -> None:
    """Proves (issue 57, item 6): ``--on-drift adapt``'s raise of the server's learning rate
    reaches each shard's optimizer, so two shards step as one raised server does, bit for
    bit, and not as an unraised one; back at 1 they step as configured again."""
    start = np.random.default_rng(5).standard_normal(N).astype(np.float32)
    raised, after = _deltas(6, 3), _deltas(7, 2)
    centers = []
    for shards, scale in ((1, 5.0), (2, 5.0), (2, None)):
        algo = _sync()
        with parameter_server(algo, SPEC, start, host="127.0.0.1", shards=shards) as server:
            if scale is not None:
                scaler = server if shards > 1 else algo
                assert scaler.scale_learning_rate(scale)
            _push(server, raised)
            if scale is not None:
                assert scaler.scale_learning_rate(1.0)
            centers.append(_push(server, after))
    one, two, unraised = centers
    assert np.array_equal(one, two)
    assert not np.allclose(two, unraised)


def test_a_task_retried_across_shards_is_applied_once_on_every_shard() -> None:
    """Proves: an attempt that died between its shards (its second exchange applied on shard
    0 only) leaves shards that refuse a checkpoint and a task count with one line each; the
    retry starts after the exchange every shard applied, shard 0 drops its repeat, shard 1
    applies it, and each slice of the center holds each exchange once (and a model server
    reads that center from both shards)."""
    algo = algorithms.get("downpour")
    with parameter_server(
        algo, SPEC, np.zeros(N, np.float32), host="127.0.0.1", shards=2
    ) as server:
        (h0, p0, a, b), (h1, p1, _, _) = server.shards
        task = task_key("t", 0, 0)
        with ps.ShardedClient(server.shards, secret=server.secret, worker=0, size=N) as first:
            assert first.begin(task, steps=6, window=2) == 0
            first.pull()
            first.push(np.full(N, 1, np.float32))  # exchange 1, on both shards
        with ps.Client(
            (h0, p0), secret=server.secret, worker=0, size=b - a
        ) as half:  # died after shard 0
            half.begin(task, steps=6, window=2)
            half.push(np.full(b - a, 10, np.float32))  # exchange 2, shard 0 only
        with pytest.raises(StreamtrainError, match="applied different pushes \\(2, 1\\)"):
            server.checkpoint()
        with pytest.raises(StreamtrainError, match="applied different exchanges of one task"):
            server.applied(task)
        with ps.ShardedClient(server.shards, secret=server.secret, worker=1, size=N) as retry:
            assert retry.begin(task, steps=6, window=2) == 1  # what every shard applied
            retry.pull()
            retry.push(np.full(N, 100, np.float32))  # exchange 2 again: a repeat on shard 0
            retry.push(np.full(N, 1000, np.float32))  # exchange 3
            assert retry.repeats == 1
        assert server.applied(task) == (3, 6)
        center, clock, _ = server.checkpoint()
        stats = server.stats()
        # A model server reads the live center from every shard.
        live = LiveWeights(f"{h0}:{p0}", secret=server.secret, size=N, shards=list(server.shards))
        try:
            served = live._refresh()
        finally:
            live.close()
    assert np.array_equal(served.weights, center) and served.version == 3
    assert (
        clock == 3
        and stats["repeats_dropped"] == 1
        and [s["clock"] for s in stats["shards"]] == [3, 3]
    )
    assert np.array_equal(center[a:b], np.full(b - a, 1 + 10 + 1000, np.float32))
    assert np.array_equal(center[b:], np.full(N - b, 1 + 100 + 1000, np.float32))


def test_shards_whose_rounds_grouped_one_push_differently_still_checkpoint_as_one() -> None:
    """Proves: a synchronous worker killed between its shards lands its push in a round with
    the other worker's on shard 0 and, retried, in a round of its own on shard 1; every
    shard applied both pushes once, so the checkpoint is taken (the highest clock and Adam
    step count) where shards that compared clocks refused it."""
    import threading

    with parameter_server(
        _sync(2), SPEC, np.zeros(N, np.float32), host="127.0.0.1", shards=2
    ) as server:
        (h0, p0, a, b), (h1, p1, _, _) = server.shards
        server.expect_workers(1)
        task = task_key("t", 1, 0)
        with ps.ShardedClient(server.shards, secret=server.secret, worker=0, size=N) as steady:
            steady.pull()
            with ps.Client((h0, p0), secret=server.secret, worker=1, size=b - a) as killed:
                killed.begin(task, steps=1, window=1)
                killed.pull()
                pushed = threading.Thread(
                    target=killed.push_pull, args=(np.ones(b - a, np.float32),)
                )
                pushed.start()  # shard 0's round waits for the steady worker, a member there
                steady.push_pull(
                    np.ones(N, np.float32)
                )  # shard 0: a round of both; shard 1: its own
                pushed.join(30)
                assert not pushed.is_alive()
        with ps.Client((h1, p1), secret=server.secret, worker=1, size=N - b) as retry:
            assert retry.begin(task, steps=1, window=1) == 0  # shard 1 never had it
            retry.pull()
            retry.push_pull(np.ones(N - b, np.float32))
        stats = server.stats()
        _, clock, state = server.checkpoint()
    assert (
        [s["clock"] for s in stats["shards"]] == [1, 2]
        and clock == 2
        and int(state["iterations"]) == 2
    )


def test_bad_shard_counts_are_one_clear_line() -> None:
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(ConfigError, match="expected a positive integer. Received: ps_shards=0"):
        Trainer(model, algorithm="downpour", ps_shards=0)
    with pytest.raises(
        ConfigError,
        match="Expected between 1 and 3 parameter-server shards for 3 weights. Received: 4",
    ):
        Trainer(model, algorithm="downpour", num_workers=1, ps_shards=4).train(
            np.zeros((4, 2)), np.zeros(4)
        )
