"""Synchronous rounds past a straggler (issue 43): a round closes without a slow worker,
its late gradient is applied once in a later round, and its task's ledger holds against a
speculative copy of the straggler's task."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from pipeline.jobs.run_metrics import RunMetrics
from pipeline.train.ps import Client, ParameterServer
from pipeline.train.ps import protocol as p

SECRET = b"per-run-secret"
N = 100


def _client(server: ParameterServer, worker: int) -> Client:
    return Client(server.address, secret=SECRET, worker=worker, size=N)


def _together(work: Callable[[Client], None], clients: list[Client]) -> None:
    """Run ``work`` for each client on a thread of its own, wait for all, close the clients."""
    threads = [threading.Thread(target=work, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for c in clients:
        c.close()
    assert not any(t.is_alive() for t in threads), "a worker did not finish within 60 s"


def _until(condition, timeout_s: float = 10) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.01)


def test_a_straggler_neither_holds_the_rounds_nor_loses_or_doubles_its_gradient() -> None:
    """Proves: with the straggler's second push held back until the fast worker is done, the
    fast worker's five rounds close without it (no wait for the 600 s timeout), each counted
    as short; a speculative copy of the straggler's task applies its exchange 2 once, and the
    straggler's own late exchange 2 is dropped as a repeat: every exchange counts once."""
    fast_task, slow_task = p.task_key("t", 0, 0), p.task_key("t", 1, 0)
    ones, threes = np.ones(N, np.float32), np.full(N, 3, np.float32)
    events: list[str] = []
    with ParameterServer(
        np.zeros(N, np.float32),
        secret=SECRET,
        sync_workers=2,
        sync_timeout_s=600,
        straggler_wait=0.5,
        on_event=events.append,
    ) as s:
        fast, slow = _client(s, 0), _client(s, 1)
        for c, task in ((fast, fast_task), (slow, slow_task)):
            c.begin(task, steps=6, window=1)
            c.pull()
        first = threading.Thread(target=slow.push_pull, args=(threes,))
        first.start()
        fast.push_pull(ones)  # round 1: both workers (a first push has no pace to cut it short)
        first.join(10)
        assert s.clock == 1 and s.stats()["short_rounds"] == 0

        def run_fast() -> None:
            for _ in range(5):  # exchanges 2-6, each after a little "compute"
                time.sleep(0.05)
                fast.push_pull(ones)
            fast.close()

        began = time.monotonic()
        runner = threading.Thread(target=run_fast)
        runner.start()
        runner.join(30)
        assert not runner.is_alive() and time.monotonic() - began < 30
        assert s.clock == 6 and s.stats()["short_rounds"] == 5 and events.count("short_round") == 5
        assert s.applied(fast_task) == (6, 6)

        # Spark copies the straggler's task; the copy starts after the one exchange applied.
        with _client(s, 1) as copy:
            assert copy.begin(slow_task, steps=6, window=1) == 1
            copy.pull()
            raced = threading.Thread(target=copy.push_pull, args=(threes,))
            raced.start()
            _until(lambda: s.applied(slow_task) == (2, 2))
            slow.push_pull(threes)  # the straggler's late exchange 2: a repeat, answered at once
            raced.join(10)
            assert not raced.is_alive() and slow.repeats == 1 and copy.repeats == 0
        slow.close()
    # Round 1's mean (1 + 3) / 2, five rounds of the fast worker alone, exchange 2 of the slow task
    # once.
    np.testing.assert_allclose(s.weights(), np.full(N, 2 + 5 + 3, np.float32))
    assert s.clock == 7 and s.stats()["repeats_dropped"] == 1 and s.applied(slow_task) == (2, 2)


def test_equal_workers_keep_whole_rounds() -> None:
    """Proves: two workers at the same pace (0.4 s of "compute" a window) still meet in every
    round: no round is cut short by the jitter between them."""
    with ParameterServer(
        np.zeros(N, np.float32),
        secret=SECRET,
        sync_workers=2,
        sync_timeout_s=600,
        straggler_wait=0.5,
    ) as s:
        clients = [_client(s, w) for w in range(2)]

        def work(c: Client) -> None:
            c.pull()
            for _ in range(5):
                time.sleep(0.4)
                c.push_pull(np.ones(N, np.float32))

        _together(work, clients)
        assert s.clock == 5 and s.stats()["short_rounds"] == 0


def test_short_rounds_and_broken_connections_reach_prometheus() -> None:
    m = RunMetrics(dataset="mnist", algorithm="sync", topic="t", workers=2)
    m.on_ps_event("short_round")
    m.on_ps_event("short_round")
    m.on_ps_event("broken")
    assert m.meters.ps_short_rounds._value.get() == 2
    assert m.meters.ps_broken_connections._value.get() == 1


def test_a_bad_round_wait_is_one_line_before_anything_starts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            "--dataset",
            "mnist",
            "--out",
            str(tmp_path / "r"),
        ],
        env={**os.environ, "PYTHONPATH": str(root), "STREAMTRAIN_ROUND_WAIT": "-1"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert "Expected STREAMTRAIN_ROUND_WAIT" in done.stderr and "'-1'" in done.stderr
    assert not (tmp_path / "r").exists()


def test_local_mode_rounds_wait_for_every_worker_unless_the_operator_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On one machine a late worker is jitter, not a slow host: its rounds wait for it (a
    short round steps on half its batch and lands the late gradient a round stale); a
    cluster's rounds go on without a straggler; the environment's setting wins in both."""
    from pipeline import config
    from pipeline.jobs.run_config import RunConfig
    from pipeline.jobs.run_training import _round_wait

    monkeypatch.delenv("STREAMTRAIN_ROUND_WAIT", raising=False)
    assert _round_wait(RunConfig(master="local[*]"), config.Settings()) == 0.0
    assert _round_wait(RunConfig(master="spark://10.0.0.1:7077"), config.Settings()) == 0.5
    monkeypatch.setenv("STREAMTRAIN_ROUND_WAIT", "0.3")
    assert _round_wait(RunConfig(master="local[*]"), config.Settings()) == 0.3


def test_a_straggler_is_answered_at_once_and_its_gradient_lands_once_with_the_next_push() -> None:
    """Proves: once its pace shows it is the slower (0.3 s of "compute" against 0.02 s), a
    straggler whose push opens a round does not wait for it to close; the fast worker does
    not wait for a straggler due later than its window; every gradient lands in exactly one
    round (each push adds 1 at an index of its own: a round of two leaves 0.5 there, a
    round of one 1.0), and the one still waiting when the batch ends lands at the checkpoint."""
    with ParameterServer(
        np.zeros(N, np.float32),
        secret=SECRET,
        sync_workers=2,
        sync_timeout_s=600,
        straggler_wait=0.5,
    ) as s:
        fast, slow = _client(s, 0), _client(s, 1)
        fast.pull()
        slow.pull()
        fast_at, slow_at = iter(range(0, 60)), iter(range(60, N))

        def one_hot(i: int) -> np.ndarray:
            delta = np.zeros(N, np.float32)
            delta[i] = 1
            return delta

        own_in_answer: list[float] = []  # each slow push's own index in the center it got back

        def run_slow() -> None:
            for _ in range(4):
                time.sleep(0.3)
                i = next(slow_at)
                own_in_answer.append(float(slow.push_pull(one_hot(i))[i]))

        thread = threading.Thread(target=run_slow)
        thread.start()
        fast_pushes = 0
        while thread.is_alive() and fast_pushes < 55:  # bounded: 60 indices
            time.sleep(0.02)
            fast.push_pull(one_hot(next(fast_at)))
            fast_pushes += 1
        thread.join(30)
        assert not thread.is_alive()
        s.checkpoint()  # the batch's end: a gradient still waiting is applied now
        w = s.weights()
        pushed = np.concatenate([w[:fast_pushes], w[60:64]])
        assert set(np.round(pushed, 3)) <= {0.5, 1.0} and np.count_nonzero(w) == fast_pushes + 4, w
        # Its first push had no pace and waited for its round; once it was the straggler, a
        # push of its that opened a round was answered before the round was applied (its own
        # gradient not yet in the center), one that found the fast worker waiting closed it.
        assert own_in_answer[0] > 0 and 0.0 in own_in_answer[1:], own_in_answer
        assert s.stats()["short_rounds"] >= fast_pushes // 2
        fast.close()
        slow.close()


def test_the_server_splits_a_round_s_exchange_into_the_wait_for_peers_and_its_step() -> None:
    """Proves: a worker 0.3 s behind its peer in each of three rounds shows as ~0.9 s of
    waiting for the round (the early push's, not the late one's), and a 0.1 s step as ~0.2 s
    a round (both pushes wait for it); the run's report turns them into shares of the
    workers' exchange seconds."""
    from pipeline.train.breakdown import exchange_parts

    def slow_step(center: np.ndarray, delta: np.ndarray, **_: object) -> None:
        time.sleep(0.1)
        center += delta

    with ParameterServer(
        np.zeros(N, np.float32), secret=SECRET, rule=slow_step, sync_workers=2, sync_timeout_s=60
    ) as s:
        clients = [_client(s, w) for w in range(2)]
        spent = [0.0, 0.0]

        def work(c: Client) -> None:
            w = clients.index(c)
            c.pull()
            for _ in range(3):
                time.sleep(0.3 * w)  # worker 1 "computes" 0.3 s longer
                began = time.monotonic()
                c.push_pull(np.ones(N, np.float32))
                spent[w] += time.monotonic() - began

        _together(work, clients)
        stats = s.stats()
    assert s.clock == 3
    assert 0.8 <= stats["round_wait_s"] <= 1.2, stats["round_wait_s"]
    assert 0.55 <= stats["round_step_s"] <= 0.8, stats["round_step_s"]
    parts = exchange_parts(sum(spent), stats)
    assert parts["round_wait"] > parts["server_step"] > parts["transfer_and_load"] >= 0
