"""The parameter server's sealed frames (AES-256-GCM): weights never cross the socket in
clear, and a frame altered, replayed, reordered or sealed for another connection is
refused and counted. Real server, real sockets on loopback."""

from __future__ import annotations

import contextlib
import socket
import threading

import numpy as np
import pytest

from pipeline.train.ps import Client, ParameterServer
from pipeline.train.ps import protocol as p
from tests.train.ps.test_server import _raw_session, _reply_status

SECRET = b"per-run-secret"
N = 1000


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with ParameterServer(np.zeros(N, np.float32), secret=SECRET, shared_memory=False) as s:
        yield s


def _push(seq: int, value: float = 1.0) -> tuple[p.Header, bytes]:
    payload = np.full(N, value, np.float32).tobytes()
    return p.Header(p.PUSH, 0, seq, 0, len(payload)), payload


def _refused_as_auth(server: ParameterServer, sock: socket.socket, frame: bytes) -> None:
    sock.sendall(frame)
    assert p.STATUS[_reply_status(sock)] == "auth"
    sock.close()
    assert server.stats()["refused"] == {"auth": 1}


def test_a_tampered_ciphertext_byte_is_refused_and_nothing_is_applied(
    server: ParameterServer,
) -> None:
    sock, session = _raw_session(server)
    frame = bytearray(session.frame(*_push(1)))
    frame[p.HEADER.size + 123] ^= 0x01  # one bit of the encrypted payload
    _refused_as_auth(server, sock, bytes(frame))
    assert server.clock == 0 and not server.weights().any()


def test_a_replayed_frame_is_refused(server: ParameterServer) -> None:
    sock, session = _raw_session(server)
    frame = session.frame(*_push(1))
    sock.sendall(frame)
    raw = bytearray(p.HEADER.size)
    p.recv_exact(sock, memoryview(raw))
    assert p.unpack(raw).op == p.OK and server.clock == 1
    _refused_as_auth(server, sock, frame)  # the same bytes again
    assert server.clock == 1


def test_a_replay_under_a_later_sequence_number_does_not_open(server: ParameterServer) -> None:
    """The sequence number is in the authenticated header: rewriting it breaks the tag."""
    sock, session = _raw_session(server)
    frame = session.frame(*_push(1))
    sock.sendall(frame)
    p.recv_exact(sock, memoryview(bytearray(p.HEADER.size)))
    forged = bytearray(frame)
    forged[12:16] = (2).to_bytes(4, "little")
    _refused_as_auth(server, sock, bytes(forged))
    assert server.clock == 1


def test_reordered_frames_are_refused_even_with_their_sequence_numbers_in_order(
    server: ParameterServer,
) -> None:
    """Proves: the nonce is the frame's place in the connection, not its header's word. Two
    frames sealed in one order and sent in the other are refused, even when their headers'
    sequence numbers read in order (only the frame counters disagree)."""
    sock, session = _raw_session(server)
    session.frame(*_push(2, 5.0))  # the second frame, sealed first (nonce 1): it is late
    first = session.frame(*_push(1, 7.0))  # sealed second (nonce 2), sent first
    _refused_as_auth(server, sock, first)
    assert server.clock == 0


def test_a_frame_sealed_for_another_connection_is_refused(server: ParameterServer) -> None:
    sock_a, session_a = _raw_session(server)
    sock_b, _ = _raw_session(server)
    _refused_as_auth(server, sock_b, session_a.frame(*_push(1)))
    sock_a.close()
    assert server.clock == 0


class _Tap:
    """A loopback TCP proxy that records every byte each way."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()
        self.sent: list[bytes] = []  # client to server
        self.received: list[bytes] = []  # server to client
        self.threads: list[threading.Thread] = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        up = socket.create_connection(self.upstream, timeout=10)
        for a, b, log in ((conn, up, self.sent), (up, conn, self.received)):
            t = threading.Thread(target=self._pump, args=(a, b, log), daemon=True)
            t.start()
            self.threads.append(t)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, log: list[bytes]) -> None:
        try:
            while data := src.recv(1 << 16):
                log.append(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.listener.close()
        for t in self.threads:
            t.join(10)


def test_weights_on_the_wire_are_not_in_clear(server: ParameterServer) -> None:
    """Proves: a push's delta and the center a pull returns cross the socket encrypted: a
    tap between worker and server sees neither's bytes, while the worker gets its center."""
    pattern = (np.arange(N, dtype=np.float32) * 0.25 + 1000.0).astype(np.float32)
    tap = _Tap(server.address)
    try:
        with Client(tap.address, secret=SECRET, worker=0, size=N, shared_memory=False) as c:
            c.pull()
            center = c.push_pull(pattern).copy()
            doubled = c.push_pull(pattern).copy()
    finally:
        tap.close()
    np.testing.assert_array_equal(center, pattern)
    np.testing.assert_array_equal(doubled, 2 * pattern)
    sent, received = b"".join(tap.sent), b"".join(tap.received)
    assert (
        len(sent) > 2 * N * 4 and len(received) > 2 * N * 4
    )  # the payloads did go through the tap
    for clear in (pattern.tobytes(), (2 * pattern).tobytes()):
        for window in range(0, len(clear) - 64, 512):  # no 64-byte run of either, anywhere
            assert clear[window : window + 64] not in sent
            assert clear[window : window + 64] not in received


def test_no_nonce_is_used_twice_under_a_key() -> None:
    """Proves: each frame a side seals gets the next nonce (the same header and payload seal
    differently every time), and a side refuses to seal past the counter's range rather
    than reuse one."""
    session = p.Session.client(p.Keys.derive(SECRET, b"s" * 16, b"c" * 16))
    frames = {session.frame(*_push(1)) for _ in range(3)}
    assert len(frames) == 3
    session._sealed = p.MAX_FRAMES - 1
    session.frame(*_push(1))
    with pytest.raises(p.ProtocolError, match="reconnect"):
        session.frame(*_push(1))
