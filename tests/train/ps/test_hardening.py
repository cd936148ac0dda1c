"""The parameter server against hostile or broken peers: refusals on /metrics, poison
updates, slow handshakes, and memory an authenticated client can claim."""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.request

import numpy as np
import pytest

from pipeline.jobs.run_metrics import RunMetrics
from pipeline.observe import exposition
from pipeline.train.ps import Client, ParameterServer, ProtocolError
from tests.train.ps.test_server import _raw_session

SECRET = b"per-run-secret"
N = 1000


def _wait(condition, timeout_s: float = 10.0, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.02)


def test_refusals_reach_prometheus(caplog: pytest.LogCaptureFixture) -> None:
    """Proves: a peer with the wrong secret is refused and the refusal is on the run's
    /metrics (streamtrain_ps_refusals_total{reason="auth"}), every reason a series from 0."""
    run = RunMetrics(dataset="mnist", algorithm="sync", topic="t", workers=1)
    served = exposition.serve(run.meters.registry)
    try:

        def scrape() -> str:
            with urllib.request.urlopen(served.url, timeout=5) as r:  # noqa: S310 (loopback)
                return str(r.read().decode())

        assert 'streamtrain_ps_refusals_total{reason="auth"} 0.0' in scrape()
        assert 'streamtrain_ps_refusals_total{reason="busy"} 0.0' in scrape()
        with ParameterServer(
            np.zeros(N, np.float32), secret=SECRET, on_refusal=run.on_ps_refusal
        ) as server:
            with (
                pytest.raises((ProtocolError, ConnectionError)),
                Client(server.address, secret=b"guess", worker=0, size=N) as c,
            ):
                c.pull()
            _wait(
                lambda: 'streamtrain_ps_refusals_total{reason="auth"} 1.0' in scrape(),
                what="the refusal on /metrics",
            )
    finally:
        served.stop()


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "tcp"])
@pytest.mark.parametrize("poison", [np.nan, np.inf, 3e38], ids=["nan", "inf", "huge"])
def test_a_poison_push_is_refused_counted_and_the_center_stays_whole(
    shared: bool, poison: float
) -> None:
    """Proves: a push holding a NaN, an Inf or a finite 3e38 (which decodes fine) is refused
    with its own status, counted as "nonfinite", and never reaches the center; its task's
    exchange is not applied, so a retry of it is applied once; other workers go on."""
    from pipeline.train.ps import protocol as p

    with ParameterServer(np.zeros(N, np.float32), secret=SECRET, shared_memory=shared) as server:
        bad = np.ones(N, np.float32)
        bad[17] = poison
        task = p.task_key("t", 0, 0)
        with Client(server.address, secret=SECRET, worker=0, size=N) as c:
            assert c.begin(task, steps=1, window=1) == 0
            c.pull()
            with pytest.raises(ProtocolError, match="nonfinite"):
                c.push_pull(bad)
        with Client(server.address, secret=SECRET, worker=0, size=N) as c:  # the retry
            assert c.begin(task, steps=1, window=1) == 0
            c.pull()
            assert c.push_pull(np.ones(N, np.float32)).tolist() == [1.0] * N
        assert server.stats()["refused"] == {"nonfinite": 1}
        assert np.isfinite(server.weights()).all() and server.clock == 1
        assert server.applied(task) == (1, 1)


def _handshaken(server: ParameterServer) -> socket.socket:
    """A raw connection past the handshake (it holds an authenticated slot)."""
    sock, _ = _raw_session(server)
    return sock


def _closed(sock: socket.socket, timeout_s: float) -> bool:
    """Whether the server closed ``sock`` within ``timeout_s`` (reading what it sent)."""
    sock.settimeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if sock.recv(4096) == b"":
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return False


def test_a_trickling_handshake_meets_a_deadline_and_cannot_lock_workers_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Proves: a peer sending one byte every 0.3 s is dropped when the whole handshake's
    deadline (1 s) passes, not after per-read timeouts ("handshake"); peers stuck in the
    handshake fill their own budget only: an authenticated worker already connected keeps
    working beside them, and a new one gets in once the deadline frees the budget."""
    from pipeline.train.ps import transport

    monkeypatch.setattr(transport, "HANDSHAKE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(transport, "MAX_UNAUTHENTICATED", 3)
    with (
        ParameterServer(np.zeros(N, np.float32), secret=SECRET) as server,
        Client(server.address, secret=SECRET, worker=0, size=N) as worker,
    ):
        slow = [socket.create_connection(server.address, timeout=5) for _ in range(3)]
        started = time.monotonic()
        for _ in range(10):  # bounded: 3 s of trickle at most
            for sock in slow:
                with contextlib.suppress(OSError):  # dropped already
                    sock.send(b"x")
            assert worker.pull().shape == (N,)  # the authenticated worker is served meanwhile
            if server.stats()["refused"].get("handshake", 0) == 3:
                break
            time.sleep(0.3)
        assert server.stats()["refused"].get("handshake") == 3, server.stats()["refused"]
        assert time.monotonic() - started < 2.5  # the deadline, not 10 reads x 1 s
        with Client(server.address, secret=SECRET, worker=1, size=N) as late:
            assert late.pull().shape == (N,)
        for sock in slow:
            sock.close()


def test_authenticated_connections_are_capped_and_pulled_copies_go_with_their_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Proves: past MAX_CONNECTIONS authenticated connections, one more is refused ("busy")
    after its handshake, so a client with the secret cannot claim unbounded buffers; a
    rule's pulled center (ADAG) is kept per live connection, whatever worker ids clients
    claim, and freed when it closes."""
    from pipeline.train.ps import transport

    monkeypatch.setattr(transport, "MAX_CONNECTIONS", 3)
    with ParameterServer(np.zeros(N, np.float32), secret=SECRET, keep_pulled=True) as server:
        held = [_handshaken(server) for _ in range(3)]
        extra = _handshaken(server)
        assert _closed(extra, 5)
        _wait(lambda: server.stats()["refused"].get("busy") == 1, what="the fourth refused")
        for sock in held:
            sock.close()
        for worker in range(10):  # ten claimed ids, one connection each, one at a time
            with Client(server.address, secret=SECRET, worker=1000 + worker, size=N) as c:
                c.pull()
                # The one before was freed when its connection closed (the server sees that a moment
                # later).
                _wait(
                    lambda: server.stats()["pulled_copies"] == 1,
                    what="one pulled copy, this connection's",
                )
        _wait(lambda: server.stats()["pulled_copies"] == 0, what="the pulled copies freed")


def test_a_repeat_of_a_task_forgotten_by_the_table_is_never_applied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Proves: when the task table forgets a task to stay bounded, a straggler's repeat of
    its first exchange is dropped as a repeat, not applied a second time."""
    from pipeline.train.ps import protocol as p
    from pipeline.train.ps import tasks

    monkeypatch.setattr(tasks, "MAX_TASKS", 2)
    with (
        ParameterServer(np.zeros(N, np.float32), secret=SECRET) as server,
        Client(server.address, secret=SECRET, worker=0, size=N) as c,
    ):
        keys = [p.task_key("t", 0, first) for first in range(4)]
        for key in keys:
            c.begin(key, steps=1, window=1)
            c.pull()
            c.push_pull(np.ones(N, np.float32))
        assert server.clock == 4
        c.begin(keys[0], steps=1, window=1)  # forgotten: the table says 0 applied
        c.pull()
        c.push_pull(np.ones(N, np.float32))
        assert server.clock == 4 and c.repeats == 1
        assert server.weights().tolist() == [4.0] * N
