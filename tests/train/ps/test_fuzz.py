"""The parameter server against hostile peers: random and mutated frames, from peers that
do not hold the secret and from peers that do; a server that does not prove the secret; the
connection cap and the timeouts. Real server, real sockets on loopback."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import tracemalloc
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.train.ps import Client, ParameterServer, transport
from pipeline.train.ps import protocol as p
from pipeline.train.ps.protocol import ProtocolError

SECRET = b"fuzz-secret"
N = 1000
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def server() -> Iterator[ParameterServer]:
    with ParameterServer(np.zeros(N, np.float32), secret=SECRET, shared_memory=False) as s:
        yield s


def _refused(server: ParameterServer) -> int:
    """Refusals, and frames cut short on an authenticated connection (a broken worker's)."""
    stats = server.stats()
    return sum(stats["refused"].values()) + stats["broken_connections"]


def _still_serves(server: ParameterServer) -> None:
    """A proper worker is served, and nothing a fuzzed frame carried was applied."""
    with Client(server.address, secret=SECRET, worker=0, size=N, shared_memory=False) as c:
        assert not c.pull().any() and server.clock == 0


def _handshake(server: ParameterServer) -> tuple[socket.socket, p.Session]:
    sock = socket.create_connection(server.address, timeout=5)
    theirs = bytearray(p.NONCE_BYTES)
    p.recv_exact(sock, memoryview(theirs))
    ours = os.urandom(p.NONCE_BYTES)
    sock.sendall(ours + p.client_proof(SECRET, bytes(theirs), ours))
    answer = bytearray(1 + p.PROOF_BYTES)
    p.recv_exact(sock, memoryview(answer))
    return sock, p.Session.client(p.Keys.derive(SECRET, bytes(theirs), ours))


def _until_closed(sock: socket.socket) -> None:
    """Read what the server answers until it closes the connection (bounded: 5 s timeout)."""
    try:
        while sock.recv(1 << 16):
            pass
    except OSError:
        pass
    finally:
        sock.close()


def _send_and_close(sock: socket.socket, data: bytes) -> None:
    """Send ``data`` (the server may refuse and close part way), then wait for its close."""
    with contextlib.suppress(OSError):
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    _until_closed(sock)


@FUZZ
@given(junk=st.binary(max_size=200))
def test_random_bytes_from_a_peer_without_the_secret_are_refused_and_counted(server, junk) -> None:  # type: ignore[no-untyped-def]
    """Proves: whatever a peer without the secret sends in place of its proof, the server
    refuses it, counts it once, applies nothing and keeps serving."""
    before = _refused(server)
    sock = socket.create_connection(server.address, timeout=5)
    _send_and_close(sock, junk)
    _still_serves(server)
    assert _refused(server) == before + 1


def _valid_frame(session: p.Session, op: int, seq: int) -> bytes:
    payload = np.ones(N, np.float32).tobytes() if op in (p.PUSH, p.PUSH_PULL) else b""
    # Task identity on pushes and PROGRESS (an intact push after the first is a repeat,
    # dropped and answered: not a refusal).
    task = (
        {"task": 12345, "exchange": 1, "steps": 3}
        if op in (p.PUSH, p.PUSH_PULL, p.PROGRESS)
        else {}
    )
    return session.frame(p.Header(op, 0, seq, 0, len(payload), **task), payload)


@FUZZ
@given(
    op=st.sampled_from([p.PULL, p.PUSH, p.PUSH_PULL, p.STATS, p.PEEK, p.PROGRESS]),
    flips=st.lists(
        st.tuples(st.integers(min_value=0), st.integers(min_value=1, max_value=255)),
        min_size=1,
        max_size=4,
    ),
    cut=st.none() | st.integers(min_value=0),
)
def test_mutated_frames_from_a_peer_with_the_secret_are_refused_and_counted(
    server, op, flips, cut
) -> None:  # type: ignore[no-untyped-def]
    """Proves: a frame altered anywhere (header, MAC or payload), or cut short, is refused
    and counted once; nothing it carries is applied; the server keeps serving."""
    before = _refused(server)
    sock, session = _handshake(server)
    valid = _valid_frame(session, op, seq=1)
    frame = bytearray(valid)
    for at, x in flips:
        frame[at % len(frame)] ^= x
    if cut is not None:
        frame = frame[: cut % len(frame)]
    if bytes(frame) == valid:  # the flips cancelled out
        sock.close()
        return
    _send_and_close(sock, bytes(frame))
    _still_serves(server)
    # Nothing sent is a worker that connected and left; anything else is one refusal.
    assert _refused(server) == before + (1 if frame else 0)


@FUZZ
@given(
    length=st.integers(min_value=0, max_value=(1 << 64) - 1),
    op=st.integers(min_value=0, max_value=255),
)
def test_declared_lengths_never_size_an_allocation(server, length, op) -> None:  # type: ignore[no-untyped-def]
    """Proves: any op with any declared length, correctly sealed, is answered or refused from
    its header alone; the server's allocations stay bounded (measured with tracemalloc)."""
    tracemalloc.start()
    try:
        sock, session = _handshake(server)
        header, _ = session.seal(
            p.Header(op, 0, 1, 0, length)
        )  # the header alone: its payload never comes
        _send_and_close(sock, header)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    _still_serves(server)


def test_a_server_that_does_not_prove_the_secret_is_refused_by_the_worker() -> None:
    """Proves: a worker stops at the handshake when the server answers without the secret,
    before it sends or trains from anything."""
    listener = socket.create_server(("127.0.0.1", 0))

    def impostor() -> None:
        conn, _ = listener.accept()
        conn.sendall(os.urandom(p.NONCE_BYTES))
        p.recv_exact(conn, memoryview(bytearray(p.NONCE_BYTES + p.PROOF_BYTES)))
        conn.sendall(bytes([p.OK]) + os.urandom(p.PROOF_BYTES))
        conn.close()

    t = threading.Thread(target=impostor, daemon=True)
    t.start()
    with pytest.raises(ProtocolError, match="did not prove"):
        Client(listener.getsockname(), secret=SECRET, worker=0, size=N, shared_memory=False)
    t.join(5)
    listener.close()


def test_a_reply_longer_than_the_request_allows_is_refused_before_any_allocation() -> None:
    """Proves: the worker checks a reply's declared length against the op before reading or
    allocating (a server, or a peer in between, declaring a terabyte gets an error)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def liar() -> None:
        conn, _ = listener.accept()
        ours = os.urandom(p.NONCE_BYTES)
        conn.sendall(ours)
        answer = bytearray(p.NONCE_BYTES + p.PROOF_BYTES)
        p.recv_exact(conn, memoryview(answer))
        theirs = bytes(answer[: p.NONCE_BYTES])
        conn.sendall(bytes([p.OK]) + p.server_proof(SECRET, ours, theirs))
        p.recv_exact(conn, memoryview(bytearray(p.HEADER.size)))  # the STATS request
        server_end = p.Session.server(p.Keys.derive(SECRET, ours, theirs))
        header, _ = server_end.seal(p.Header(p.OK, 0, 1, 0, 1 << 40))
        conn.sendall(header)
        conn.close()

    t = threading.Thread(target=liar, daemon=True)
    t.start()
    with (
        Client(listener.getsockname(), secret=SECRET, worker=0, size=N, shared_memory=False) as c,
        pytest.raises(ProtocolError, match="does not fit"),
    ):
        c.stats()
    t.join(5)
    listener.close()


def test_connections_beyond_the_cap_and_silent_peers_are_refused_and_counted(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Proves: a connection past the handshake budget evicts the oldest pending handshake
    ("evicted", closed at once) and is served itself; a peer silent in the handshake
    ("handshake") or after it ("idle") is closed after its timeout."""
    monkeypatch.setattr(transport, "MAX_UNAUTHENTICATED", 2)
    monkeypatch.setattr(transport, "HANDSHAKE_TIMEOUT_S", 0.5)
    monkeypatch.setattr(transport, "IDLE_TIMEOUT_S", 0.5)
    with ParameterServer(np.zeros(N, np.float32), secret=SECRET, shared_memory=False) as s:
        silent = [socket.create_connection(s.address, timeout=5) for _ in range(2)]
        for sock in silent:
            sock.recv(p.NONCE_BYTES)  # accepted: the server sent its nonce
        third = socket.create_connection(s.address, timeout=5)
        assert len(third.recv(p.NONCE_BYTES)) == p.NONCE_BYTES  # served: it pushed the oldest out
        _until_closed(silent[0])  # at once
        for sock in [silent[1], third]:
            _until_closed(sock)  # the silent ones, after the handshake timeout
        idle, _ = _handshake(s)
        _until_closed(idle)
        assert s.stats()["refused"] == {"evicted": 1, "handshake": 2, "idle": 1}
        with Client(s.address, secret=SECRET, worker=0, size=N, shared_memory=False) as c:
            assert c.pull().shape == (N,)


def test_frames_pack_as_documented() -> None:
    assert p.HEADER.size == 64 and struct.calcsize("<4sBBHIIQQQII16s") == 64
