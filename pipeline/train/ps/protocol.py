"""The parameter server's wire protocol: fixed binary headers and raw float32 buffers.

No pickle and no JSON on the hot path. A connection opens with a challenge:
the server sends a random nonce, the client answers HMAC-SHA256(secret, nonce);
both then derive a session key. Every request header after that carries a MAC
over the header and a sequence number, so no request is accepted from a peer
without the per-run secret and none can be replayed. Payloads (weights, deltas)
are not MACed: hashing 4 MB costs ~3 ms, as much as the exchange itself, and the
header MAC already binds the request to an authenticated connection.

A worker on the server's own machine (Spark's local mode) may move payloads
through shared memory instead (see :mod:`pipeline.train.ps.shm`): two ATTACH requests
set it up, and a request flagged SHARED then carries its payload, and gets its
response's, in the connection's shared file; such a response declares length 0.

Request and response header (48 bytes, little-endian):

======  =====  =============================================================
offset  type   field
======  =====  =============================================================
0       4s     magic ``b"STPS"``
4       u8     protocol version (1)
5       u8     op (PULL, PUSH, PUSH_PULL, STATS, ATTACH, PEEK) or, in a response, a status
6       u16    flags (request: SHARED; response: the push's staleness, or 1 for an accepted ATTACH)
8       u32    worker id
12      u32    sequence number (per connection, from 1)
16      u64    clock (request: the clock the worker last pulled; response: now)
24      u64    payload bytes
32      16s    MAC (requests only; zeros in responses)
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
VERSION = 1
HEADER = struct.Struct("<4sBBHIIQQ16s")
NONCE_BYTES = 16
MAC_BYTES = 16

# Ops (requests). PEEK reads the center like PULL but is no worker's pull: it joins no
# synchronous round and moves no staleness clock (what serving reads the live model with).
PULL, PUSH, PUSH_PULL, STATS, ATTACH, PEEK = 1, 2, 3, 4, 5, 6
OPS = {PULL: "pull", PUSH: "push", PUSH_PULL: "push_pull", STATS: "stats", ATTACH: "attach", PEEK: "peek"}
# Request flags.
SHARED = 1  # the payloads travel in the connection's shared-memory file
COOKIE_BYTES = 16  # the second ATTACH's payload (see pipeline.train.ps.shm)
# Statuses (responses).
OK, ERR_AUTH, ERR_FRAME, ERR_SIZE = 0, 0xE1, 0xE2, 0xE3
STATUS = {OK: "ok", ERR_AUTH: "auth", ERR_FRAME: "frame", ERR_SIZE: "size"}


class ProtocolError(StreamtrainError):
    """A frame that breaks the protocol, or a refusal from the server."""


@dataclasses.dataclass(frozen=True)
class Header:
    op: int
    worker: int
    seq: int
    clock: int
    length: int
    flags: int = 0
    mac: bytes = b"\0" * MAC_BYTES


def session_key(secret: bytes, nonce: bytes) -> bytes:
    """The key both sides derive after the challenge."""
    return hmac.new(secret, b"session" + nonce, hashlib.sha256).digest()


def challenge_answer(secret: bytes, nonce: bytes) -> bytes:
    """What a client proves it holds the secret with."""
    return hmac.new(secret, b"hello" + nonce, hashlib.sha256).digest()


def _mac(key: bytes, h: Header) -> bytes:
    body = HEADER.pack(MAGIC, VERSION, h.op, h.flags, h.worker, h.seq, h.clock, h.length, b"\0" * MAC_BYTES)
    return hmac.new(key, body, hashlib.sha256).digest()[:MAC_BYTES]


def pack(h: Header, key: bytes | None = None) -> bytes:
    """Encode a header; with ``key``, sign it.

    >>> h = Header(PULL, worker=1, seq=1, clock=0, length=0)
    >>> len(pack(h, b"k" * 32))
    48
    >>> unpack(pack(h, b"k" * 32)).op == PULL
    True
    """
    mac = _mac(key, h) if key is not None else h.mac
    return HEADER.pack(MAGIC, VERSION, h.op, h.flags, h.worker, h.seq, h.clock, h.length, mac)


def unpack(raw: bytes | bytearray | memoryview) -> Header:
    """Decode a header, refusing a wrong magic or version."""
    magic, version, op, flags, worker, seq, clock, length, mac = HEADER.unpack(raw)
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(f"not a streamtrain parameter-server frame (magic {magic!r}, version {version})")
    return Header(op, worker, seq, clock, length, flags, bytes(mac))


def verify(key: bytes, h: Header) -> bool:
    """Whether the header's MAC is right for ``key``."""
    return hmac.compare_digest(_mac(key, h), h.mac)


def recv_exact(sock: socket.socket, buf: memoryview) -> None:
    """Fill ``buf`` from ``sock``; raise ConnectionError if the peer closes first."""
    got = 0
    while got < len(buf):
        n = sock.recv_into(buf[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection mid-frame")
        got += n
