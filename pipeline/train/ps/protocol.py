"""The parameter server's wire protocol: fixed binary headers and raw float32 buffers.

No pickle and no JSON on the hot path. Each side proves the per-run secret: the server
sends a nonce, the client answers with its own nonce and HMAC-SHA256(secret, both), the
server answers with a status byte and an HMAC of its own over both (so a worker never
sends weights to, or trains from, a server that does not hold the secret). Both derive
the connection's two keys, one per direction, with HKDF-SHA256 from the secret and the two
nonces: fresh for every connection, since the server's nonce is.

Every frame after that, request and reply, is sealed with AES-256-GCM (:class:`Session`):
its header is the AEAD's associated data (authenticated, in clear: the receiver must read
the lengths before anything else) and its payload is encrypted, so weights never cross the
network in clear. The nonce is the direction's frame counter, never sent and never reused
under a key (a side refuses to seal past 2**32 - 1 frames, the sequence number's range); a
frame replayed, reordered, taken from another connection, cut or altered does not open. A
response also repeats its request's sequence number. Lengths are checked against what the
op allows before anything is read or allocated: a header never sizes a buffer. AES-GCM runs
on the CPU's AES and carry-less multiply instructions at ~3.6 GB/s a core here, against
~1.4 GB/s for the HMAC-SHA256 that authenticated frames before (protocol version 3).

A push may carry its task's identity (a 64-bit key of the offset range it trains) and
its exchange's index within that task, so that the server applies each exchange of a
range once however often Spark runs the task (a retry, a speculative copy): PROGRESS
asks how many exchanges of a task the server already applied, and a retry skips them.

A worker on the server's own machine (Spark's local mode) may move payloads
through shared memory instead (see :mod:`pipeline.train.ps.shm`): two ATTACH requests
set it up, and a request flagged SHARED then carries its payload, and gets its
response's, in the connection's shared file (mode 0600, mapped only after the peer proved
the secret and the file's cookie); such a frame has no payload on the socket, so its tag
authenticates its header alone (a MAC, GMAC).

Request and response header (64 bytes, little-endian):

======  =====  =============================================================
offset  type   field
======  =====  =============================================================
0       4s     magic ``b"STPS"``
4       u8     protocol version (4)
5       u8     op (PULL, PUSH, PUSH_PULL, STATS, ATTACH, PEEK, PROGRESS) or, in a response, a status
6       u16    flags (request: SHARED, and the payloads' type on the socket, see
               :mod:`pipeline.train.ps.wire`; response: the push's staleness, or 1 for an
               accepted ATTACH)
8       u32    worker id
12      u32    sequence number (per connection, from 1; a response repeats its request's)
16      u64    clock (request: the clock the worker last pulled; response: now)
24      u64    payload bytes
32      u64    task: the key of the range a push or PROGRESS is about (0: none)
40      u32    exchange: a push's index within its task, from 1 (response to a push or
               PROGRESS: the task's exchanges applied so far)
44      u32    steps: the mini-batches a push covers (response: those the server applied
               from it, 0 for a repeat it dropped; to PROGRESS: all the task's applied)
48      16s    AES-GCM tag over the header (this field zeroed) and the payload on the socket
======  =====  =============================================================

The payload on the socket (``payload bytes`` of it) follows, encrypted. A refusal's status
goes out unsealed (its tag zero): the connection ends with it either way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import socket
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from pipeline.errors import StreamtrainError

MAGIC = b"STPS"
VERSION = 4
HEADER = struct.Struct("<4sBBHIIQQQII16s")
NONCE_BYTES = 16
TAG_BYTES = 16
#: Frames a connection may seal in each direction (the sequence number's range): the
#: counter that makes each AES-GCM nonce can never wrap under one key.
MAX_FRAMES = 0xFFFFFFFF

# Ops (requests). PEEK reads the center like PULL but is no worker's pull: it joins no
# synchronous round and moves no staleness clock (what serving reads the live model with).
PULL, PUSH, PUSH_PULL, STATS, ATTACH, PEEK, PROGRESS = 1, 2, 3, 4, 5, 6, 7
# ROWS: embedding rows read and pushed (pipeline.train.ps.row_server), to a row server only.
ROWS = 8
OPS = {
    PULL: "pull",
    PUSH: "push",
    PUSH_PULL: "push_pull",
    STATS: "stats",
    ATTACH: "attach",
    PEEK: "peek",
    PROGRESS: "progress",
    ROWS: "rows",
}
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
    tag: bytes = b"\0" * TAG_BYTES


def client_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What a client proves it holds the secret with."""
    return hmac.new(secret, b"client" + server_nonce + client_nonce, hashlib.sha256).digest()


def server_proof(secret: bytes, server_nonce: bytes, client_nonce: bytes) -> bytes:
    """What the server proves it holds the secret with (another label: not a replayed client
    proof)."""
    return hmac.new(secret, b"server" + server_nonce + client_nonce, hashlib.sha256).digest()


@dataclasses.dataclass(frozen=True)
class Keys:
    """A connection's two AES-256 keys: one per direction, so a reply can never pass as a
    request."""

    request: bytes
    reply: bytes

    @classmethod
    def derive(cls, secret: bytes, server_nonce: bytes, client_nonce: bytes) -> Keys:
        both = HKDF(
            hashes.SHA256(),
            length=64,
            salt=server_nonce + client_nonce,
            info=b"streamtrain parameter server v4: request, reply",
        ).derive(secret)
        return cls(both[:32], both[32:])


def pack(h: Header) -> bytes:
    """Encode a header as it is, tag included (:meth:`Session.seal` sets the tag).

    >>> unpack(pack(Header(PULL, worker=1, seq=1, clock=0, length=3))).length
    3
    """
    return HEADER.pack(
        MAGIC,
        VERSION,
        h.op,
        h.flags,
        h.worker,
        h.seq,
        h.clock,
        h.length,
        h.task,
        h.exchange,
        h.steps,
        h.tag,
    )


def _aad(h: Header) -> bytes:
    """The header as the AEAD's associated data: its tag field zeroed."""
    return HEADER.pack(
        MAGIC,
        VERSION,
        h.op,
        h.flags,
        h.worker,
        h.seq,
        h.clock,
        h.length,
        h.task,
        h.exchange,
        h.steps,
        bytes(TAG_BYTES),
    )


def unpack(raw: bytes | bytearray | memoryview) -> Header:
    """Decode a header, refusing a wrong magic or version."""
    magic, version, op, flags, worker, seq, clock, length, task, exchange, steps, tag = (
        HEADER.unpack(raw)
    )
    if magic != MAGIC or version != VERSION:
        raise ProtocolError(
            f"not a streamtrain parameter-server frame (magic {magic!r}, version {version})"
        )
    return Header(op, worker, seq, clock, length, flags, task, exchange, steps, bytes(tag))


Buffer = bytes | bytearray | memoryview


class Session:
    """One end of a connection: seals the frames it sends and opens those it receives, with
    AES-256-GCM under the direction's key and the direction's frame count as the nonce.

    A frame's ciphertext (and its tag) is written to, and received into, a ``room`` the
    caller lends where it has one free (the server lends its connection's buffers), else
    this session's scratch, grown only to what this end sends or has accepted from a
    header: a payload costs one pass of the cipher each way and no copy.

    Example:
        >>> keys = Keys.derive(b"secret", b"s" * 16, b"c" * 16)
        >>> client, server = Session.client(keys), Session.server(keys)
        >>> header, body = client.seal(Header(PUSH, worker=1, seq=1, clock=0, length=4), b"wxyz")
        >>> bytes(body) != b"wxyz", len(header)
        (True, 64)
        >>> into = bytearray(4)
        >>> h = unpack(header); server.inlet(h.length, memoryview(into))[:] = body
        >>> server.open(h, memoryview(into)), bytes(into)
        (True, b'wxyz')
        >>> server.open(h, memoryview(into))  # the same frame again: a replay
        False
    """

    def __init__(self, seal_key: bytes, open_key: bytes, capacity: int = 0) -> None:
        self._sealer, self._opener = AESGCM(seal_key), AESGCM(open_key)
        self._sealed = self._opened = 0
        self._scratch = bytearray(capacity + TAG_BYTES)

    @classmethod
    def client(cls, keys: Keys, capacity: int = 0) -> Session:
        return cls(keys.request, keys.reply, capacity)

    @classmethod
    def server(cls, keys: Keys, capacity: int = 0) -> Session:
        return cls(keys.reply, keys.request, capacity)

    def _room(self, n: int, room: memoryview | None = None) -> memoryview:
        """``n`` bytes and a tag's: in ``room`` where they fit, else in the scratch."""
        if room is not None and len(room) >= n + TAG_BYTES:
            return room[: n + TAG_BYTES]
        if len(self._scratch) < n + TAG_BYTES:
            self._scratch = bytearray(n + TAG_BYTES)
        return memoryview(self._scratch)[: n + TAG_BYTES]

    def seal(
        self, h: Header, payload: Buffer = b"", room: memoryview | None = None
    ) -> tuple[bytes, memoryview]:
        """The header to send (its tag set) and the ciphertext to send after it, in ``room``
        (not ``payload``'s memory) or the scratch, valid until either is next written.
        ``h.length`` must be ``len(payload)``."""
        if self._sealed >= MAX_FRAMES:
            raise ProtocolError("this connection sealed all the frames one key may: reconnect")
        self._sealed += 1
        n = len(payload)
        out = self._room(n, room)
        aad = _aad(h)
        self._sealer.encrypt_into(_nonce(self._sealed), payload, aad, out)
        return aad[:-TAG_BYTES] + bytes(out[n:]), out[:n]

    def frame(self, h: Header, payload: Buffer = b"") -> bytes:
        """A whole sealed frame, header and ciphertext (for small frames and tests)."""
        header, body = self.seal(h, payload)
        return header + bytes(body)

    def inlet(self, n: int, into: memoryview, room: memoryview | None = None) -> memoryview:
        """Where to receive a frame's ``n`` payload bytes (in ``room`` where they fit, not
        ``into``'s memory), whose plaintext :meth:`open` then writes to ``into``."""
        return self._room(n, room)[:n]

    def open(self, h: Header, into: memoryview, room: memoryview | None = None) -> bool:
        """Whether the frame whose payload was received into :meth:`inlet` (given the same
        ``room``) is authentic, next in order and this connection's; if so its plaintext
        is now in ``into``."""
        self._opened += 1
        n = h.length
        data = self._room(n, room)  # what inlet gave, and room for the tag after it
        data[n:] = h.tag
        try:
            self._opener.decrypt_into(_nonce(self._opened), data, _aad(h), into[:n])
        except InvalidTag:
            return False
        return True


def _nonce(count: int) -> bytes:
    return count.to_bytes(12, "little")


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


def task_key(topic: str, partition: int, first_offset: int, replay: int = 0) -> int:
    """The 64-bit key that names one offset range's training task (never 0), the same in
    every attempt Spark makes at it; ``replay`` > 0 names the range trained again after a
    drift (:mod:`pipeline.train.adapt`), a task of its own whose exchanges count apart.

    >>> task_key("mnist", 0, 0) == task_key("mnist", 0, 0) != task_key("mnist", 1, 0)
    True
    >>> task_key("mnist", 0, 0, replay=1) != task_key("mnist", 0, 0)
    True
    """
    name = f"{topic}\0{partition}\0{first_offset}" + (f"\0replay {replay}" if replay else "")
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1
