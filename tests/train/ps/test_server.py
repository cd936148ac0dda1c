"""The parameter server: consistency, concurrency, staleness, refusal of bad frames, and
the shared-memory transport for workers on its machine."""

from __future__ import annotations

import contextlib
import glob
import os
import socket
import threading
import time

import numpy as np
import pytest

from pipeline.train.ps import Client, ParameterServer, ProtocolError, shm
from pipeline.train.ps import protocol as p

SECRET = b"per-run-secret"
N = 1000


@pytest.fixture(params=["shared", "tcp"])
def server(request):  # type: ignore[no-untyped-def]
    """A server whose clients exchange through shared memory (the default here), or one that offers
    none."""
    with ParameterServer(
        np.zeros(N, np.float32), secret=SECRET, shared_memory=request.param == "shared"
    ) as s:
        yield s


def _client(server: ParameterServer, worker: int = 0, secret: bytes = SECRET) -> Client:
    return Client(server.address, secret=secret, worker=worker, size=N)


def test_push_then_pull_is_consistent(server: ParameterServer) -> None:
    rng = np.random.default_rng(0)
    deltas = rng.standard_normal((5, N)).astype(np.float32)
    with _client(server) as c:
        assert c.shared == server.shared_memory
        c.pull()
        for d in deltas:
            c.push(d)
        assert np.allclose(c.pull(), deltas.sum(axis=0), atol=1e-5)
        assert np.allclose(c.push_pull(deltas[0]), deltas.sum(axis=0) + deltas[0], atol=1e-5)
        assert c.clock == server.clock == 6


def test_concurrent_clients_lose_no_update(server: ParameterServer) -> None:
    workers, pushes = 4, 50

    def work(w: int) -> None:
        with _client(server, w) as c:
            c.pull()
            for _ in range(pushes):
                c.push_pull(np.full(N, 1.0, np.float32))

    threads = [threading.Thread(target=work, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert server.clock == workers * pushes
    assert np.array_equal(server.weights(), np.full(N, workers * pushes, np.float32))
    stats = server.stats()
    # Every push was counted once in the staleness histogram, and some were stale.
    assert sum(stats["staleness"].values()) == workers * pushes
    assert stats["ops"]["push_pull"] == workers * pushes


def test_staleness_is_updates_since_the_workers_last_pull(server: ParameterServer) -> None:
    with _client(server, 0) as a, _client(server, 1) as b:
        a.pull()
        b.pull()
        for _ in range(3):
            b.push(np.zeros(N, np.float32))
        assert a.push(np.zeros(N, np.float32)) == 3
        assert b.push(np.zeros(N, np.float32)) == 4  # b pulled at 0; its own pushes count too
        a.pull()
        assert a.push(np.zeros(N, np.float32)) == 0


def test_rule_sees_staleness_and_pulled_center() -> None:
    seen = []

    def rule(
        center: np.ndarray, delta: np.ndarray, *, staleness: int, pulled: np.ndarray | None
    ) -> None:
        seen.append((staleness, None if pulled is None else pulled.copy()))
        center += delta / (staleness + 1)

    with (
        ParameterServer(np.ones(N, np.float32), secret=SECRET, rule=rule, keep_pulled=True) as s,
        _client(s) as c,
    ):
        c.pull()
        c.push(np.full(N, 2.0, np.float32))
        c.push(np.full(N, 2.0, np.float32))
    assert [st for st, _ in seen] == [0, 1]
    assert np.array_equal(seen[0][1], np.ones(N, np.float32))
    assert np.allclose(s.weights(), 1 + 2 + 1)


def test_wrong_secret_is_refused_and_counted(server: ParameterServer) -> None:
    with pytest.raises((ProtocolError, ConnectionError)), _client(server, secret=b"guess") as c:
        c.pull()
    with _client(server) as c:  # the server keeps serving
        c.pull()
    assert server.stats()["refused"] == {"auth": 1}


def _raw_session(server: ParameterServer) -> tuple[socket.socket, p.Session]:
    """A connection past the handshake, and its client end's session (which seals requests)."""
    sock = socket.create_connection(server.address, timeout=5)
    theirs = bytearray(p.NONCE_BYTES)
    p.recv_exact(sock, memoryview(theirs))
    ours = b"n" * p.NONCE_BYTES
    sock.sendall(ours + p.client_proof(SECRET, bytes(theirs), ours))
    answer = bytearray(1 + p.PROOF_BYTES)
    p.recv_exact(sock, memoryview(answer))
    assert answer[0] == p.OK and bytes(answer[1:]) == p.server_proof(SECRET, bytes(theirs), ours)
    return sock, p.Session.client(p.Keys.derive(SECRET, bytes(theirs), ours))


def _reply_status(sock: socket.socket) -> int:
    raw = bytearray(p.HEADER.size)
    p.recv_exact(sock, memoryview(raw))
    return p.unpack(raw).op


@pytest.mark.parametrize(
    "make, reason",
    [
        # A push declaring 1 TB: refused from the header, nothing allocated.
        (lambda s: p.pack(p.Header(p.PUSH, 0, 1, 0, 1 << 40)), "size"),
        # A pull that claims a payload.
        (lambda s: p.pack(p.Header(p.PULL, 0, 1, 0, 8)), "size"),
        # A header sealed with the wrong key, and one replayed with an old sequence number.
        (
            lambda s: p.Session.client(p.Keys(b"x" * 32, b"x" * 32)).frame(
                p.Header(p.PULL, 0, 1, 0, 0)
            ),
            "auth",
        ),
        (lambda s: s.frame(p.Header(p.PULL, 0, 7, 0, 0)), "auth"),
        # Garbage instead of a header, and an unknown op.
        (lambda s: b"GET / HTTP/1.1\r\n" + b"\0" * (p.HEADER.size - 16), "frame"),
        (lambda s: s.frame(p.Header(99, 0, 1, 0, 0)), "frame"),
    ],
)
def test_bad_frames_are_refused_counted_and_the_server_keeps_serving(server, make, reason) -> None:  # type: ignore[no-untyped-def]
    sock, session = _raw_session(server)
    sock.sendall(make(session))
    status = _reply_status(sock)
    sock.close()
    assert p.STATUS[status] == reason
    assert server.stats()["refused"] == {reason: 1}
    with _client(server) as c:
        assert c.pull().shape == (N,)


def test_a_workers_broken_push_is_counted_as_such_and_nothing_is_applied(
    server: ParameterServer,
) -> None:
    """Proves: a push cut short on an authenticated connection (a worker killed mid-exchange)
    applies nothing and counts as a broken connection, not as a refusal (issue 43)."""
    sock, session = _raw_session(server)
    header, body = session.seal(
        p.Header(p.PUSH, 0, 1, 0, N * 4), np.ones(N, np.float32).data.cast("B")
    )
    sock.sendall(header + bytes(body[:40]))
    sock.close()
    deadline = time.monotonic() + 10
    while not server.stats()["broken_connections"]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    with _client(server) as c:
        assert not c.pull().any()
        stats = c.stats()
    assert stats["broken_connections"] == 1 and stats["refused"] == {} and server.clock == 0


def test_stop_frees_the_port_even_with_clients_connected() -> None:
    s = ParameterServer(np.zeros(N, np.float32), secret=SECRET).start()
    port = s.port
    c = _client(s)
    c.pull()
    s.stop()
    with ParameterServer(np.zeros(N, np.float32), secret=SECRET, port=port) as again:
        assert again.port == port
    c.close()


def _push_in_thread(client: Client, delta: np.ndarray) -> tuple[threading.Thread, list[np.ndarray]]:
    got: list[np.ndarray] = []
    t = threading.Thread(target=lambda: got.append(client.push_pull(delta).copy()), daemon=True)
    t.start()
    return t, got


def test_a_worker_that_leaves_the_synchronous_rounds_does_not_hold_them_up() -> None:
    # A timeout far beyond the joins below: a round that waited for it would fail the test.
    with ParameterServer(
        np.zeros(N, np.float32), secret=SECRET, sync_workers=2, sync_timeout_s=600
    ) as s:
        a, b = _client(s, 0), _client(s, 1)
        a.pull(), b.pull()
        t, got = _push_in_thread(a, np.ones(N, np.float32))
        b.push_pull(np.full(N, 3, np.float32))
        t.join(30)
        assert got and np.all(got[0] == 2)  # one round: the mean of both pushes
        b.close()  # its partition ran out
        t, got = _push_in_thread(a, np.full(N, 5, np.float32))
        t.join(30)
        assert got and np.all(got[0] == 7) and s.clock == 2  # a round of one
        a.close()


def test_a_peeker_reads_the_center_without_joining_rounds_or_moving_staleness(
    server: ParameterServer,
) -> None:
    """Proves: what serving reads the live model with (PEEK) is no worker's pull: a
    synchronous round of one worker completes with a peeker connected, and a worker's
    staleness counts only its own pulls."""
    with ParameterServer(
        np.zeros(N, np.float32),
        secret=SECRET,
        sync_workers=1,
        sync_timeout_s=600,
        shared_memory=server.shared_memory,
    ) as s:
        peeker, worker = _client(s, 0xFFFFFFFF), _client(s, 0)
        assert np.all(peeker.peek() == 0) and peeker.clock == 0
        worker.pull()
        t, got = _push_in_thread(worker, np.ones(N, np.float32))
        t.join(30)  # a peeker that had joined the round would hold it up for 600 s
        assert got and s.clock == 1
        assert np.all(peeker.peek() == 1) and peeker.clock == 1
        assert s.stats()["workers"] == 1  # the peeker is no worker
        peeker.close(), worker.close()


def test_expected_workers_set_the_round_size() -> None:
    with ParameterServer(
        np.zeros(N, np.float32), secret=SECRET, sync_workers=2, sync_timeout_s=600
    ) as s:
        s.expect_workers(1)  # this job has one task
        with _client(s) as c:
            c.pull()
            t, got = _push_in_thread(c, np.ones(N, np.float32))
            t.join(30)
        assert got and np.all(got[0] == 1) and s.clock == 1


def test_checkpoint_carries_the_optimizer_and_restore_continues_its_path() -> None:
    from pipeline.train import algorithms
    from pipeline.train.model import ModelSpec

    spec = ModelSpec("{}", "adam", "mse", ((N,),))
    grads = np.random.default_rng(0).standard_normal((3, N)).astype(np.float32)

    def server(algo: algorithms.Algorithm) -> ParameterServer:
        algo.bind(spec)
        return ParameterServer(
            np.zeros(N, np.float32), secret=SECRET, rule=algo.apply, state=algo, sync_workers=1
        )

    with server(algorithms.get("sync")) as s, _client(s) as c:
        c.pull()
        for g in grads[:2]:
            c.push_pull(g)
        weights, clock, state = s.checkpoint()
        expected = c.push_pull(grads[2]).copy()
    assert clock == 2 and int(state["iterations"]) == 2 and state["m"].shape == (N,)
    with server(algorithms.get("sync")) as s, _client(s) as c:
        s.restore(weights, clock, state)
        c.pull()
        assert np.array_equal(c.push_pull(grads[2]), expected)  # Adam's moments came back too


def _shm_files() -> set[str]:
    return set(glob.glob(f"{shm.SHM_DIR}/{shm.PREFIX}*"))


def test_a_worker_on_this_machine_maps_the_servers_file_and_no_name_is_left() -> None:
    before = _shm_files()
    with ParameterServer(np.zeros(N, np.float32), secret=SECRET) as s, _client(s) as c:
        assert c.shared and s.stats()["shared_memory"] == 1
        assert _shm_files() <= before  # unlinked once both sides mapped it
        center = c.push_pull(np.full(N, 2, np.float32))
        assert np.all(center == 2) and np.all(s.weights() == 2)
    with (
        ParameterServer(np.zeros(N, np.float32), secret=SECRET) as s,
        Client(s.address, secret=SECRET, worker=0, size=N, shared_memory=False) as c,
    ):
        assert not c.shared and s.stats()["shared_memory"] == 0  # the worker may decline


def test_a_wrong_cookie_withdraws_the_offer_and_shared_requests_are_then_refused(
    server: ParameterServer,
) -> None:
    sock, session = _raw_session(server)
    sock.sendall(session.frame(p.Header(p.ATTACH, 0, 1, 0, 0)))
    raw = bytearray(p.HEADER.size)
    p.recv_exact(sock, memoryview(raw))
    offer = p.unpack(raw)
    token = bytearray(offer.length)
    p.recv_exact(sock, session.inlet(offer.length, memoryview(token)))
    assert session.open(offer, memoryview(token))
    if server.shared_memory:
        path = shm.path_of(token.decode())
        assert os.path.isfile(path) and os.stat(path).st_mode & 0o777 == 0o600
        # A worker on another machine reads no cookie (or another file's): it answers zeros.
        zeros = bytes(p.COOKIE_BYTES)
        sock.sendall(session.frame(p.Header(p.ATTACH, 0, 2, 0, p.COOKIE_BYTES), zeros))
        p.recv_exact(sock, memoryview(raw))
        assert p.unpack(raw).flags == 0 and not os.path.exists(path)
    else:
        assert not token  # nothing offered
    sock.sendall(
        session.frame(p.Header(p.PULL, 0, 3 if server.shared_memory else 2, 0, 0, flags=p.SHARED))
    )
    assert p.STATUS[_reply_status(sock)] == "frame"
    sock.close()
    assert server.stats()["refused"] == {"frame": 1} and server.stats()["shared_memory"] == 0


def test_a_shared_file_that_is_not_the_servers_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    token = os.urandom(shm.TOKEN_BYTES).hex()
    with pytest.raises(FileNotFoundError):  # the server is on another machine
        shm.SharedBuffers.open(token, N)
    path = shm.path_of(token)
    with open(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(bytes(shm.file_bytes(N) - 4))  # one float short
    try:
        with pytest.raises(ProtocolError, match="not the parameter server's"):
            shm.SharedBuffers.open(token, N)
    finally:
        os.unlink(path)


def test_shared_memory_and_tcp_workers_meet_in_one_synchronous_round() -> None:
    with (
        ParameterServer(
            np.zeros(N, np.float32), secret=SECRET, sync_workers=2, sync_timeout_s=600
        ) as s,
        _client(s, 0) as a,
        Client(s.address, secret=SECRET, worker=1, size=N, shared_memory=False) as b,
    ):
        assert a.shared and not b.shared
        a.pull(), b.pull()
        t, got = _push_in_thread(a, np.ones(N, np.float32))
        center = b.push_pull(np.full(N, 3, np.float32)).copy()
        t.join(30)
        assert got and np.array_equal(got[0], center) and np.all(center == 2) and s.clock == 1


def test_a_starting_server_removes_shared_files_left_an_hour_ago() -> None:
    old, new = (shm.path_of(os.urandom(shm.TOKEN_BYTES).hex()) for _ in range(2))
    for path in (old, new):
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    two_hours_ago = os.stat(old).st_mtime - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    try:
        with ParameterServer(np.zeros(N, np.float32), secret=SECRET):
            assert not os.path.exists(old)
            assert os.path.exists(new)  # maybe another server's, between its offer and the answer
    finally:
        for path in (old, new):
            if os.path.exists(path):
                os.unlink(path)


def test_a_flood_of_junk_is_counted_in_full_and_logged_in_a_few_lines(caplog) -> None:  # type: ignore[no-untyped-def]
    """Proves: 300 connections of random bytes (short and long) are each refused and counted,
    while the log gets the first refusal and a summary, not a line per connection."""
    import logging

    rng = np.random.default_rng(0)
    attempts = 300  # bounded: a fixed number of connections, each closed at once
    with (
        caplog.at_level(logging.WARNING, logger="pipeline.train.ps.transport"),
        ParameterServer(np.zeros(N, np.float32), secret=SECRET) as s,
    ):
        for i in range(attempts):
            with socket.create_connection(s.address, timeout=5) as sock:
                sock.recv(p.NONCE_BYTES)
                sock.sendall(
                    rng.bytes(int(rng.integers(1, 32)) if i % 2 else int(rng.integers(32, 200)))
                )
        deadline = time.monotonic() + 10
        while sum(s.stats()["refused"].values()) < attempts and time.monotonic() < deadline:
            time.sleep(0.05)
        refused = s.stats()["refused"]
        with _client(s) as c:  # and it still serves
            assert c.pull().shape == (N,)
    assert sum(refused.values()) == attempts and set(refused) == {"auth", "truncated"}, refused
    lines = [r for r in caplog.records if "refused" in r.getMessage()]
    assert 1 <= len(lines) <= 3, [r.getMessage() for r in lines]
    assert "more are summed up" in lines[0].getMessage()


def test_each_exchange_of_a_task_is_applied_once_across_attempts(server: ParameterServer) -> None:
    """Proves: a task's exchanges are applied once however attempts interleave: an attempt
    that died after two exchanges, its retry that starts after them, and a speculative copy
    that began beside the retry (its pushes dropped as repeats, each still answered)."""
    task, ones = p.task_key("t", 0, 0), np.ones(N, np.float32)
    with _client(server, 0) as killed:
        assert killed.begin(task, steps=10, window=3) == 0  # exchanges of 3, 3, 3 and 1 steps
        killed.pull()
        killed.push_pull(ones)
        killed.push_pull(ones)
    with _client(server, 0) as retry, _client(server, 0) as copy:
        assert retry.begin(task, steps=10, window=3) == 2
        assert copy.begin(task, steps=10, window=3) == 2
        for c in (retry, copy, retry, copy):
            c.pull()
            c.push_pull(ones)
        assert (retry.repeats, copy.repeats) == (0, 2)
    assert server.applied(task) == (4, 10)
    assert server.clock == 4 and server.stats()["repeats_dropped"] == 2
    np.testing.assert_array_equal(server.weights(), np.full(N, 4, np.float32))
    assert server.applied(p.task_key("t", 0, 1)) == (0, 0)  # another range: its own count


def test_a_push_that_skips_exchanges_is_refused(server: ParameterServer) -> None:
    """Proves: an exchange that is neither the task's next nor a repeat (a client off the
    protocol) is refused and counted, and applies nothing."""
    task = p.task_key("t", 0, 0)
    with _client(server) as c:
        c.begin(task, steps=10, window=3)
        c._exchange = 2  # the next push claims exchange 3 of a task with none applied
        with pytest.raises(ProtocolError):
            c.push_pull(np.ones(N, np.float32))
    assert server.stats()["refused"] == {"order": 1}
    assert server.clock == 0 and server.applied(task) == (0, 0)


def test_a_repeated_push_never_holds_a_synchronous_round() -> None:
    """Proves: in synchronous rounds of two tasks, a speculative copy of one task (connected,
    pulled, its push a repeat) is answered at once and no round waits for it: the round
    closes on the two tasks' pushes, with no wait for the timeout."""
    t1, t2, ones = p.task_key("t", 0, 0), p.task_key("t", 1, 0), np.ones(N, np.float32)
    with ParameterServer(
        np.zeros(N, np.float32), secret=SECRET, sync_workers=2, sync_timeout_s=60
    ) as s:
        with _client(s, 0) as w1, _client(s, 0) as copy, _client(s, 1) as w2:
            for c, task in ((w1, t1), (copy, t1), (w2, t2)):
                c.begin(task, steps=2, window=1)
                c.pull()
            first = threading.Thread(target=w1.push_pull, args=(ones,))
            first.start()
            deadline = time.monotonic() + 10
            while s.applied(t1) == (0, 0):  # w1's push is in the open round
                assert time.monotonic() < deadline
                time.sleep(0.01)
            began = time.monotonic()
            copy.push_pull(ones)  # a repeat of w1's: answered without joining the round
            w2.push_pull(ones)  # the round's second push: it closes
            first.join(10)
            assert not first.is_alive() and time.monotonic() - began < 10
        assert s.clock == 1 and copy.repeats == 1 and s.applied(t1) == s.applied(t2) == (1, 1)


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_idle_peers_cannot_keep_a_worker_out() -> None:
    """Proves: 200 connections from this machine that never answer the handshake (each past
    the 32-slot budget evicts the oldest of its address) do not stop a worker: its
    connection, tried again with backoff, is served, and its pushes applied."""
    from pipeline.train import ps
    from pipeline.train.ps import transport

    with ParameterServer(np.zeros(N, np.float32), secret=SECRET, shared_memory=False) as s:
        idle = []
        try:
            for _ in range(200):  # bounded: a fixed flood, held open
                with contextlib.suppress(OSError):
                    idle.append(socket.create_connection(s.address, timeout=5))
            started = time.monotonic()
            with ps.connect(
                s.address, secret=SECRET, worker=0, size=N, retry_s=30, shared_memory=False
            ) as c:
                c.push(np.ones(N, np.float32))
                assert c.pull()[0] == 1.0
            assert time.monotonic() - started < 10
            refused = s.stats()["refused"]
            assert (
                refused.get("evicted", 0) >= 200 - transport.MAX_UNAUTHENTICATED
                and "busy" not in refused
            ), refused
        finally:
            for sock in idle:
                sock.close()
