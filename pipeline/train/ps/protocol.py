"""The parameter server's wire protocol: fixed binary headers and raw float32 buffers.

No pickle and no JSON on the hot path. Each side proves the per-run secret: the server
sends a nonce, the client answers with its own nonce and HMAC-SHA256(secret, both), the
server answers with a status byte and an HMAC of its own over both (so a worker never
sends weights to, or trains from, a server that does not hold the secret). Both derive a
request key and a reply key from the secret and the two nonces.

Every frame after that, request and reply, carries a MAC over its header and its payload
bytes on the socket (HMAC-SHA256, truncated to 16 bytes), keyed by direction, with a
sequence number that a reply repeats, so no frame is accepted from a peer without the
secret, and none can be replayed, reordered or altered. Lengths are checked against what
the op allows before anything is read or allocated: a header never sizes a buffer.

A push may carry its task's identity (a 64-bit key of the offset range it trains) and
its exchange's index within that task, so that the server applies each exchange of a
range once however often Spark runs the task (a retry, a speculative copy): PROGRESS
asks how many exchanges of a task the server already applied, and a retry skips them.

A worker on the server's own machine (Spark's local mode) may move payloads
through shared memory instead (see :mod:`pipeline.train.ps.shm`): two ATTACH requests
set it up, and a request flagged SHARED then carries its payload, and gets its
response's, in the connection's shared file (mode 0600, mapped only after the peer proved
the secret and the file's cookie); such a frame's MAC covers its header.

Request and response header (64 bytes, little-endian):

======  =====  =============================================================
offset  type   field
======  =====  =============================================================
0       4s     magic ``b"STPS"``
4       u8     protocol version (3)
5       u8     op (PULL, PUSH, PUSH_PULL, STATS, ATTACH, PEEK, PROGRESS) or, in a response, a status
6       u16    flags (request: SHARED; response: the push's staleness, or 1 for an accepted ATTACH)
8       u32    worker id
12      u32    sequence number (per connection, from 1; a response repeats its request's)
16      u64    clock (request: the clock the worker last pulled; response: now)
24      u64    payload bytes
32      u64    task: the key of the range a push or PROGRESS is about (0: none)
40      u32    exchange: a push's index within its task, from 1 (response to a push or
               PROGRESS: the task's exchanges applied so far)
44      u32    steps: the mini-batches a push covers (response: those the server applied
               from it, 0 for a repeat it dropped; to PROGRESS: all the task's applied)
48      16s    MAC over the header (this field zeroed) and the payload on the socket
======  =====  =============================================================
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import socket
import struct

from pipeline.errors import StreamtrainError

MAGIC = b"STPS"
VERSION = 3
HEADER = struct.Struct("<4sBBHIIQQQII16s")
NONCE_BYTES = 16
MAC_BYTES = 16

# Ops (requests). PEEK reads the center like PULL but is no worker's pull: it joins no
# synchronous round and moves no staleness clock (what serving reads the live model with).
PULL, PUSH, PUSH_PULL, STATS, ATTACH, PEEK, PROGRESS = 1, 2, 3, 4, 5, 6, 7
OPS = {PULL: "pull", PUSH: "push", PUSH_PULL: "push_pull", STATS: "stats", ATTACH: "attach", PEEK: "peek",
       PROGRESS: "progress"}
# Request flags.
SHARED = 1  # the payloads travel in the connection's shared-memory file
COOKIE_BYTES = 16  # the second ATTACH's payload (see pipeline.train.ps.shm)
# Statuses (responses).
OK, ERR_AUTH, ERR_FRAME, ERR_SIZE, ERR_VALUE = 0, 0xE1, 0xE2, 0xE3, 0xE4
STATUS = {OK: "ok", ERR_AUTH: "auth", ERR_FRAME: "frame", ERR_SIZE: "size", ERR_VALUE: "nonfinite"}
PROOF_BYTES = 32
#: The most a reply other than the weights may carry (an ATTACH token, STATS' JSON).
MAX_TOKEN, MAX_STATS = 256, 1 << 20


class ProtocolError(StreamtrainError):
    """A frame that breaks the protocol, or a refusal from the server (``reason``: the
    refusal's, as :data:`STATUS` names it; None for a broken frame)."""

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Header:
    op: int
    worker: int
    seq: int
    clock: int
    length: int
    flags: int = 0
    task: int = 0
    exchange: int = 0
    steps: int = 0
    mac: bytes = b"\0" * MAC_BYTES


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What a client proves it holds the secret with."""
    return hmac.new(secret, b"client" + server_nonce + client_nonce, hashlib.sha256).digest()


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What the server proves it holds the secret with (another label: not a replayed client proof)."""
    return hmac.new(secret, b"server" + server_nonce + client_nonce, hashlib.sha256).digest()


@dataclasses.dataclass(frozen=True)
class Keys:
    """A session's two MAC keys: one per direction, so a reply can never pass as a request."""

    request: bytes
    reply: bytes

    @classmethod
    def derive(cls, secret: bytes, server_nonce: bytes, client_nonce: bytes) -> Keys:
        both = server_nonce + client_nonce
        return cls(hmac.new(secret, b"request" + both, hashlib.sha256).digest(),
                   hmac.new(secret, b"reply" + both, hashlib.sha256).digest())


def _mac(key: bytes, h: Header, payload: bytes | bytearray | memoryview = b"") -> bytes:
    body = HEADER.pack(MAGIC, VERSION, h.op, h.flags, h.worker, h.seq, h.clock, h.length, h.task, h.exchange,
                       h.steps, b"\0" * MAC_BYTES)
    m = hmac.new(key, body, hashlib.sha256)
    if len(payload):
        m.update(payload)
    return m.digest()[:MAC_BYTES]


def pack(h: Header, key: bytes | None = None, payload: bytes | bytearray | memoryview = b"") -> bytes:
    """Encode a header; with ``key``, sign it and ``payload`` (the bytes that follow it).

    >>> h = Header(PULL, worker=1, seq=1, clock=0, length=3)
    >>> len(pack(h, b"k" * 32, b"abc"))
    64
    >>> verify(b"k" * 32, unpack(pack(h, b"k" * 32, b"abc")), b"abc"), verify(b"k" * 32, unpack(pack(h, b"k" * 32, b"abc")), b"abd")
    (True, False)
    """
    mac = _mac(key, h, payload) if key is not None else h.mac
    return HEADER.pack(MAGIC, VERSION, h.op, h.flags, h.worker, h.seq, h.clock, h.length, h.task, h.exchange,
                       h.steps, mac)


def unpack(raw: bytes | bytearray | memoryview) -> Header:
    """Decode a header, refusing a wrong magic or version."""
    magic, version, op, flags, worker, seq, clock, length, task, exchange, steps, mac = HEADER.unpack(raw)
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(f"not a streamtrain parameter-server frame (magic {magic!r}, version {version})")
    return Header(op, worker, seq, clock, length, flags, task, exchange, steps, bytes(mac))


def verify(key: bytes, h: Header, payload: bytes | bytearray | memoryview = b"") -> bool:
    """Whether the header's MAC is right for ``key`` over the header and ``payload``."""
    return hmac.compare_digest(_mac(key, h, payload), h.mac)


class Closed(ConnectionError):
    """The peer closed the connection between frames (not in the middle of one)."""


def recv_exact(sock: socket.socket, buf: memoryview) -> None:
    """Fill ``buf`` from ``sock``; raise :class:`Closed` if the peer closed before the first
    byte, ConnectionError if it closed part way."""
    got = 0
    while got < len(buf):
        n = sock.recv_into(buf[got:])
        if n == 0:
            if got == 0:
                raise Closed("peer closed the connection")
            raise ConnectionError("peer closed the connection mid-frame")
        got += n


def task_key(topic: str, partition: int, first_offset: int) -> int:
    """The 64-bit key that names one offset range's training task (never 0), the same in
    every attempt Spark makes at it.

    >>> task_key("mnist", 0, 0) == task_key("mnist", 0, 0) != task_key("mnist", 1, 0)
    True
    """
    digest = hashlib.blake2b(f"{topic}\0{partition}\0{first_offset}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1
