"""Secured Kafka endpoints for tests, on loopback: SASL_SSL, SASL_PLAINTEXT, SSL and mutual TLS.

Managed Kafkas require TLS with SASL (SCRAM-SHA-512/256 or PLAIN) or client certificates; the
embedded brokers cannot: Tansu 0.6.0's ``broker --authentication`` refuses every request but
ApiVersions/SaslHandshake/SaslAuthenticate before a login, AlterUserScramCredentials included,
and keeps users in memory only, so no user can ever be created on it (``tansu user create``
ends in "early eof"); it offers no PLAIN. noida-db has no authentication at all. So a broker is
started as usual on a plaintext port, and put behind:

* a *front* (this module run as a child process, ``python secure_kafka.py front CONFIG``): a
  Kafka-protocol relay that answers SaslHandshake/SaslAuthenticate itself (SCRAM server side
  from ``scramp``, the library pg8000 uses; PLAIN checked against the same stored SCRAM keys),
  refuses anything but ApiVersions before a login, and then relays frames both ways. It
  rewrites the host and port in Metadata, FindCoordinator and DescribeCluster responses to
  the secured endpoint, so the broker keeps advertising its own plaintext port (the same data
  stays reachable over PLAINTEXT, for comparisons) while clients of the secured endpoint are
  never sent to it. It also writes SaslHandshake v0-1 and SaslAuthenticate v0-2 into the
  broker's ApiVersions answer.
* ``stunnel4`` for TLS (``verifyChain`` + ``requireCert`` for client certificates): a
  well-kept terminator, and C speed for throughput comparisons.

    client --TLS--> stunnel (bootstrap) --> front (SASL, rewrites) --> broker (plain_bootstrap)

Every process is a child stopped by pid (SIGTERM, wait, SIGKILL), and dies with its parent.

Example::

    with SecureKafka(tmp_path, mode="sasl_ssl") as kafka:
        Producer(kafka.confluent_conf(mechanism="SCRAM-SHA-512")).produce("t", b"v")
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import hmac
import ipaddress
import json
import os
import secrets
import select
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

#: Every SASL mechanism the front can serve; a SecureKafka enables all of them by default.
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
#: What each mode makes of the public endpoint (Kafka's ``security.protocol``).
PROTOCOLS = {
    "sasl_ssl": "SASL_SSL",
    "sasl_plaintext": "SASL_PLAINTEXT",
    "ssl": "SSL",
    "mtls": "SSL",
}
Mode = Literal["sasl_ssl", "sasl_plaintext", "ssl", "mtls"]
ServerCert = Literal["good", "other_ca", "wrong_name", "expired"]

# Kafka error codes the front answers with.
_UNSUPPORTED_SASL_MECHANISM = 33
_ILLEGAL_SASL_STATE = 34
_SASL_AUTHENTICATION_FAILED = 58
# API keys the front reads or writes.
_PRODUCE, _METADATA, _FIND_COORDINATOR, _SASL_HANDSHAKE, _API_VERSIONS = 0, 3, 10, 17, 18
_SASL_AUTHENTICATE, _DESCRIBE_CLUSTER = 36, 60
#: First flexible (compact, tagged) version of each API whose frames the front parses.
_FLEXIBLE_FROM = {
    _PRODUCE: 9,
    _METADATA: 9,
    _FIND_COORDINATOR: 3,
    _SASL_HANDSHAKE: 99,
    _API_VERSIONS: 3,
    _SASL_AUTHENTICATE: 2,
    _DESCRIBE_CLUSTER: 0,
}
#: The newest version of each parsed API whose layout the front knows: ApiVersions caps the
#: broker's offer there, so a client never sends a version the front would misread.
_KNOWN_UP_TO = {
    _PRODUCE: 13,
    _METADATA: 13,
    _FIND_COORDINATOR: 6,
    _API_VERSIONS: 4,
    _DESCRIBE_CLUSTER: 2,
}
#: Kafka's own limits: sasl.server.max.receive.size before a login, socket.request.max.bytes after.
_MAX_SASL_FRAME = 512 * 1024
_MAX_FRAME = 100 * 1024 * 1024
_LOGIN_WITHIN_S = 30.0  # a connection that has not logged in by then is closed
_SCRAM_ITERATIONS = 4096  # Kafka's minimum, and scramp's: PBKDF2 runs on each client login


# ---------------------------------------------------------------- test certificates


@dataclasses.dataclass(frozen=True)
class Pki:
    """Test certificates and keys (PEM files; keys mode 0600), all for loopback.

    ``server_*`` is valid for 127.0.0.1, ::1 and localhost, signed by ``ca``; ``client_*`` is a
    client certificate signed by ``ca``. For negative tests: ``other_ca_server_*`` and
    ``other_ca_client_*`` are signed by ``other_ca`` (which nobody trusts), ``wrong_name_*``
    (signed by ``ca``) names only wrong.example, and ``expired_*`` (signed by ``ca``, right
    names) expired yesterday.
    """

    folder: Path
    ca: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    other_ca_server_cert: Path
    other_ca_server_key: Path
    other_ca_client_cert: Path
    other_ca_client_key: Path
    wrong_name_cert: Path
    wrong_name_key: Path
    expired_cert: Path
    expired_key: Path

    def server_pair(self, which: ServerCert) -> tuple[Path, Path]:
        """The certificate and key a broker presents for ``which``."""
        return {
            "good": (self.server_cert, self.server_key),
            "other_ca": (self.other_ca_server_cert, self.other_ca_server_key),
            "wrong_name": (self.wrong_name_cert, self.wrong_name_key),
            "expired": (self.expired_cert, self.expired_key),
        }[which]


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by its owner alone, from the first byte (no chmod window)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # O_CREAT's mode does not apply to a file already there
        f.write(data)


def make_pki(folder: str | os.PathLike[str]) -> Pki:
    """Create a test PKI in ``folder`` with the ``cryptography`` package (a project dependency):
    its builder sets any validity period, which the ``openssl`` CLI here cannot (an expired
    certificate needs a not-after in the past). Keys are EC P-256: instant to generate, and
    understood by OpenSSL (librdkafka, stunnel, Python's ssl)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    loopback: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
        x509.DNSName("localhost"),
    ]

    def name(cn: str) -> x509.Name:
        return x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "streamtrain tests"),
                x509.NameAttribute(NameOID.COMMON_NAME, cn),
            ]
        )

    def save(
        stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
    ) -> tuple[Path, Path]:
        cert_path, key_path = out / f"{stem}.pem", out / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(
            key_path,
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )
        return cert_path, key_path

    def issue(
        subject: str,
        issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None,
        *,
        sans: Sequence[x509.GeneralName] = (),
        client: bool = False,
        days: tuple[float, float] = (-1, 30),
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        ca = issuer is None
        signer_cert, signer_key = issuer if issuer else (None, key)
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(signer_cert.subject if signer_cert else name(subject))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now + datetime.timedelta(days=days[0]))
            .not_valid_after(now + datetime.timedelta(days=days[1]))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
        else:
            assert signer_cert is not None
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(signer_cert.public_key()),  # type: ignore[arg-type]
                critical=False,
            ).add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH]
                ),
                critical=False,
            )
            if sans:
                builder = builder.add_extension(
                    x509.SubjectAlternativeName(list(sans)), critical=False
                )
        return builder.sign(signer_key, hashes.SHA256()), key

    ca = issue("streamtrain test CA", None, days=(-1, 365))
    other = issue("streamtrain untrusted CA", None, days=(-1, 365))
    ca_cert, ca_key = save("ca", *ca)
    other_ca, _ = save("other-ca", *other)
    server = save("server", *issue("127.0.0.1", ca, sans=loopback))
    client = save("client", *issue("streamtrain-test-client", ca, client=True))
    other_server = save("other-ca-server", *issue("127.0.0.1", other, sans=loopback))
    other_client = save("other-ca-client", *issue("streamtrain-test-client", other, client=True))
    wrong = save("wrong-name", *issue("wrong.example", ca, sans=[x509.DNSName("wrong.example")]))
    expired = save("expired", *issue("127.0.0.1", ca, sans=loopback, days=(-30, -1)))
    return Pki(
        out,
        ca_cert,
        ca_key,
        *server,
        *client,
        other_ca,
        *other_server,
        *other_client,
        *wrong,
        *expired,
    )


# ---------------------------------------------------------------- Kafka frames (the front's part)


class _Malformed(Exception):
    """A frame the front cannot read: the connection is closed."""


class _Wire:
    """A cursor over one frame; every read is bounds-checked (a short frame raises
    :class:`_Malformed`, never reads past the end)."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data, self.pos = data, pos

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise _Malformed(f"frame too short: wanted {n} bytes at {self.pos} of {len(self.data)}")
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def int8(self) -> int:
        return int(struct.unpack(">b", self.take(1))[0])

    def int16(self) -> int:
        return int(struct.unpack(">h", self.take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self.take(4))[0])

    def uvarint(self) -> int:
        value = 0
        for shift in range(0, 35, 7):  # at most 5 bytes: an int32's worth
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
        raise _Malformed("varint longer than 5 bytes")

    def length(self, compact: bool) -> int:
        """A string/bytes/array length: -1 for null."""
        return self.uvarint() - 1 if compact else self.int16()

    def string(self, compact: bool) -> str | None:
        n = self.length(compact)
        return None if n < 0 else self.take(n).decode("utf-8", "replace")

    def blob(self, compact: bool) -> bytes:
        n = self.uvarint() - 1 if compact else self.int32()
        return b"" if n < 0 else self.take(n)

    def count(self, compact: bool) -> int:
        n = self.uvarint() - 1 if compact else self.int32()
        if n > 1_000_000:
            raise _Malformed(f"array of {n} entries")
        return max(n, 0)

    def tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.take(self.uvarint())


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _string(s: str | None, compact: bool) -> bytes:
    if s is None:
        return _uvarint(0) if compact else struct.pack(">h", -1)
    raw = s.encode()
    return (_uvarint(len(raw) + 1) if compact else struct.pack(">h", len(raw))) + raw


def _blob(b: bytes, compact: bool) -> bytes:
    return (_uvarint(len(b) + 1) if compact else struct.pack(">i", len(b))) + b


def _flexible(key: int, version: int) -> bool:
    return version >= _FLEXIBLE_FROM.get(key, 99)


def _request_body(frame: bytes, key: int, version: int) -> _Wire:
    """A cursor at the body of a request: after api key, version, correlation id, client id
    (always a non-compact string) and, in flexible versions, the header's tagged fields."""
    w = _Wire(frame, 8)
    w.string(compact=False)
    if _flexible(key, version):
        w.tagged_fields()
    return w


def _response_body(frame: bytes, key: int, version: int) -> _Wire:
    """A cursor at the body of a response; ApiVersions keeps header v0 in every version."""
    w = _Wire(frame, 4)
    if key != _API_VERSIONS and _flexible(key, version):
        w.tagged_fields()
    return w


def _response(corr: int, key: int, version: int, body: bytes) -> bytes:
    """A whole response frame (size prefix included) the front answers itself."""
    header = struct.pack(">i", corr) + (
        b"\x00" if key != _API_VERSIONS and _flexible(key, version) else b""
    )
    return struct.pack(">i", len(header) + len(body)) + header + body


def _expects_response(frame: bytes, key: int, version: int) -> bool:
    """Whether the broker answers this request: all do but a Produce with acks=0."""
    if key != _PRODUCE:
        return True
    w = _request_body(frame, key, version)
    if version >= 3:
        w.string(_flexible(key, version))  # transactional_id
    return w.int16() != 0


class _Splice:
    """A copy of a frame with some byte ranges replaced, the rest kept verbatim."""

    def __init__(self, data: bytes) -> None:
        self.data, self.mark = data, 0
        self.parts: list[bytes] = []

    def replace(self, start: int, end: int, new: bytes) -> None:
        self.parts += [self.data[self.mark : start], new]
        self.mark = end

    def result(self) -> bytes:
        return b"".join([*self.parts, self.data[self.mark :]]) if self.parts else self.data


def _address(
    w: _Wire, splice: _Splice, compact: bool, host: str, port: int, *, rewrite: bool = True
) -> None:
    """Read a host and port at ``w`` and have ``splice`` write ``host:port`` in their place."""
    start = w.pos
    w.string(compact)
    w.int32()
    if rewrite:
        splice.replace(start, w.pos, _string(host, compact) + struct.pack(">i", port))


def _brokers(w: _Wire, splice: _Splice, compact: bool, rack: bool, host: str, port: int) -> None:
    """Rewrite every entry of a brokers array (node_id, host, port[, rack][, tags])."""
    for _ in range(w.count(compact)):
        w.int32()
        _address(w, splice, compact, host, port)
        if rack:
            w.string(compact)
        if compact:
            w.tagged_fields()


def rewrite_addresses(frame: bytes, key: int, version: int, host: str, port: int) -> bytes:
    """A Metadata, FindCoordinator or DescribeCluster response (without its size prefix) with
    every broker address replaced by ``host:port``; other responses come back unchanged."""
    flex = _flexible(key, version)
    w, splice = _response_body(frame, key, version), _Splice(frame)
    if key == _METADATA:
        if version >= 3:
            w.int32()  # throttle_time_ms
        _brokers(w, splice, flex, version >= 1, host, port)
    elif key == _FIND_COORDINATOR:
        if version >= 1:
            w.int32()
        if version < 4:
            w.int16()
            if version >= 1:
                w.string(flex)
            node = w.int32()
            _address(w, splice, flex, host, port, rewrite=node >= 0)
        else:
            for _ in range(w.count(True)):
                w.string(True)
                node = w.int32()
                _address(w, splice, True, host, port, rewrite=node >= 0)
                w.int16()
                w.string(True)
                w.tagged_fields()
    elif key == _DESCRIBE_CLUSTER:
        w.int32()
        w.int16()
        w.string(True)
        if version >= 1:
            w.int8()  # endpoint_type
        w.string(True)
        w.int32()
        _brokers(w, splice, True, True, host, port)
    return splice.result()


def rewrite_api_versions(frame: bytes, version: int, *, sasl: bool) -> bytes:
    """The broker's ApiVersions response (without size prefix) as the front offers it: with
    SaslHandshake v0-1 and SaslAuthenticate v0-2 when it does SASL (without them when it does
    not), and no version of a parsed API newer than the front can read."""
    flex = version >= 3
    w = _Wire(frame, 4)
    if w.int16() != 0:
        return frame  # UNSUPPORTED_VERSION in a v0 body: the client retries with an older version
    apis: dict[int, tuple[int, int]] = {}
    for _ in range(w.count(flex)):
        api, low, high = w.int16(), w.int16(), w.int16()
        if flex:
            w.tagged_fields()
        apis[api] = (low, high)
    rest = frame[w.pos :]
    apis.pop(_SASL_HANDSHAKE, None)
    apis.pop(_SASL_AUTHENTICATE, None)
    if sasl:
        apis[_SASL_HANDSHAKE], apis[_SASL_AUTHENTICATE] = (0, 1), (0, 2)
    for api, newest in _KNOWN_UP_TO.items():
        if api in apis:
            low, high = apis[api]
            if low > newest:
                del apis[api]
            else:
                apis[api] = (low, min(high, newest))
    tags = b"\x00" if flex else b""
    entries = b"".join(
        struct.pack(">hhh", a, lo, hi) + tags for a, (lo, hi) in sorted(apis.items())
    )
    count = _uvarint(len(apis) + 1) if flex else struct.pack(">i", len(apis))
    return frame[:4] + struct.pack(">h", 0) + count + entries + rest


# ---------------------------------------------------------------- the front (a child process)


@dataclasses.dataclass
class _FrontConfig:
    listen_host: str
    listen_port: int
    upstream: tuple[str, int]
    advertise: tuple[str, int]
    sasl: bool
    mechanisms: tuple[str, ...]
    #: user -> mechanism -> scramp auth info (salt, stored_key, server_key, iterations), hex in
    #: JSON.
    users: dict[str, dict[str, tuple[bytes, bytes, bytes, int]]]
    session_lifetime_ms: int | None
    max_connections: int = 256

    @classmethod
    def load(cls, path: str) -> _FrontConfig:
        raw = json.loads(Path(path).read_text())
        users = {
            name: {
                mech: (bytes.fromhex(s), bytes.fromhex(k), bytes.fromhex(v), int(i))
                for mech, (s, k, v, i) in mechs.items()
            }
            for name, mechs in raw.pop("users").items()
        }
        return cls(
            listen_host=str(raw["listen_host"]),
            listen_port=int(raw["listen_port"]),
            upstream=(str(raw["upstream"][0]), int(raw["upstream"][1])),
            advertise=(str(raw["advertise"][0]), int(raw["advertise"][1])),
            sasl=bool(raw["sasl"]),
            mechanisms=tuple(raw["mechanisms"]),
            users=users,
            session_lifetime_ms=raw["session_lifetime_ms"],
        )


_CLOSE = object()  # the responder's last item: flush what came before it, then close
#: Answers the front rewrites (the rest are relayed as they arrive).
_REWRITTEN = frozenset({_API_VERSIONS, _METADATA, _FIND_COORDINATOR, _DESCRIBE_CLUSTER})


class _Connection:
    """One client: its requests are read in order, each either relayed to the broker or
    answered here (SASL); the answers go back in request order through one queue."""

    def __init__(
        self,
        cfg: _FrontConfig,
        client: asyncio.StreamWriter,
        upstream_r: asyncio.StreamReader,
        upstream_w: asyncio.StreamWriter,
    ) -> None:
        self.cfg, self.client, self.up_r, self.up_w = cfg, client, upstream_r, upstream_w
        self.pending: asyncio.Queue[Any] = asyncio.Queue(maxsize=4096)
        self.authenticated = not cfg.sasl
        self.expires: float | None = None  # monotonic end of the session (KIP-368)
        self.mechanism: str | None = None  # chosen by SaslHandshake, until its login ends
        self.raw_tokens = False  # after SaslHandshake v0: bare SASL tokens, no Kafka headers
        self.scram: Any = None
        self.user: str | None = None
        self.peer = client.get_extra_info("peername")

    def log(self, message: str) -> None:
        print(f"front {self.peer}: {message}", file=sys.stderr, flush=True)

    async def requests(self) -> None:
        """Read the client's frames until it closes, or the front closes it."""
        loop = asyncio.get_running_loop()
        login_deadline = loop.time() + _LOGIN_WITHIN_S
        while True:
            if self.authenticated:
                frame = await _read_frame(self.client_r, _MAX_FRAME)
            else:
                left = login_deadline - loop.time()
                if left <= 0:
                    return self.log("no login in time: closed")
                frame = await asyncio.wait_for(_read_frame(self.client_r, _MAX_SASL_FRAME), left)
            if frame is None:
                return
            if self.raw_tokens:
                if not await self.raw_token(frame):
                    return
                continue
            if len(frame) < 8:
                raise _Malformed("request shorter than its header")
            key, version, corr = struct.unpack(">hhi", frame[:8])
            if self.cfg.sasl and key in (_SASL_HANDSHAKE, _SASL_AUTHENTICATE):
                answer, go_on = self.sasl(frame, key, version, corr)
                await self.pending.put(answer)
                if not go_on:
                    return
                continue
            if not self.authenticated and key != _API_VERSIONS:
                return self.log(f"api key {key} before a login: closed")
            if self.expires is not None and time.monotonic() > self.expires:
                return self.log(
                    "session expired without re-authentication: closed"
                )  # as Kafka (KIP-368)
            self.up_w.write(struct.pack(">i", len(frame)))
            self.up_w.write(frame)
            if _expects_response(frame, key, version):
                await self.pending.put((key, version, corr))
            await self.up_w.drain()

    async def responses(self) -> None:
        """Write the answers in request order: relayed ones (rewritten where they name
        brokers) and the front's own."""
        host, port = self.cfg.advertise
        while True:
            item = await self.pending.get()
            if item is _CLOSE:
                return
            if isinstance(item, bytes):
                self.client.write(item)
            else:
                key, version, corr = item
                if key not in _REWRITTEN:
                    # Cut through (Fetch answers run to megabytes): relayed as they arrive, so
                    # the front adds no store-and-forward wait to a fetch's round trip.
                    if not await self._relay(corr):
                        return None
                    await self.client.drain()
                    continue
                frame = await _read_frame(self.up_r, _MAX_FRAME)
                if frame is None:
                    return self.log("the broker closed the connection")
                if len(frame) < 4 or struct.unpack(">i", frame[:4])[0] != corr:
                    return self.log(
                        f"the broker answered out of order (wanted correlation id {corr}): closed"
                    )
                if key == _API_VERSIONS:
                    frame = rewrite_api_versions(frame, version, sasl=self.cfg.sasl)
                elif key in (_METADATA, _FIND_COORDINATOR, _DESCRIBE_CLUSTER):
                    frame = rewrite_addresses(frame, key, version, host, port)
                self.client.write(struct.pack(">i", len(frame)))
                self.client.write(frame)
            await self.client.drain()

    async def _relay(self, corr: int) -> bool:
        """Copy one answer from the broker to the client in chunks (False: the connection ends)."""
        try:
            head = await self.up_r.readexactly(8)
        except asyncio.IncompleteReadError:
            self.log("the broker closed the connection")
            return False
        size, got = struct.unpack(">ii", head)
        if got != corr or not 4 <= size <= _MAX_FRAME:
            self.log(
                f"the broker answered out of order or oversized (correlation id {got}, {size} "
                "bytes): closed"
            )
            return False
        self.client.write(head)
        left = size - 4
        while (
            left
        ):  # bounded: each read takes at least one byte of the declared size, or raises at EOF
            chunk = await self.up_r.read(min(left, 1 << 20))
            if not chunk:
                self.log("the broker closed the connection mid-answer")
                return False
            self.client.write(chunk)
            left -= len(chunk)
            await self.client.drain()
        return True

    # --- SASL, the broker's side

    def sasl(self, frame: bytes, key: int, version: int, corr: int) -> tuple[bytes, bool]:
        """Answer a SaslHandshake or SaslAuthenticate: (the response frame, whether the
        connection goes on)."""
        if key == _SASL_HANDSHAKE:
            mechanism = _request_body(frame, key, version).string(False) or ""
            offered = b"".join(_string(m, False) for m in self.cfg.mechanisms)
            listing = struct.pack(">i", len(self.cfg.mechanisms)) + offered
            # A login in progress, or a re-authentication (KIP-368) with v0: not allowed.
            if self.mechanism is not None or version > 1 or (self.authenticated and version == 0):
                return _response(
                    corr, key, version, struct.pack(">h", _ILLEGAL_SASL_STATE) + listing
                ), False
            if mechanism not in self.cfg.mechanisms:
                self.log(f"mechanism {mechanism!r} refused")
                return _response(
                    corr, key, version, struct.pack(">h", _UNSUPPORTED_SASL_MECHANISM) + listing
                ), False
            self.mechanism, self.raw_tokens = mechanism, version == 0
            return _response(corr, key, version, struct.pack(">h", 0) + listing), True
        flex = _flexible(key, version)
        if self.mechanism is None or version > 2:
            return self.authenticate_response(
                corr,
                version,
                _ILLEGAL_SASL_STATE,
                "SaslAuthenticate without a SaslHandshake before it",
                b"",
            ), False
        token = _request_body(frame, key, version).blob(flex)
        outcome = self.step(token)
        if outcome is None:
            return self.authenticate_response(
                corr, version, _SASL_AUTHENTICATION_FAILED, self.failure(), b""
            ), False
        reply, done = outcome
        lifetime = 0
        if done:
            lifetime = self.logged_in()
        return self.authenticate_response(corr, version, 0, None, reply, lifetime), True

    def authenticate_response(
        self,
        corr: int,
        version: int,
        error: int,
        message: str | None,
        token: bytes,
        lifetime_ms: int = 0,
    ) -> bytes:
        flex = _flexible(_SASL_AUTHENTICATE, version)
        body = struct.pack(">h", error) + _string(message, flex) + _blob(token, flex)
        if version >= 1:
            body += struct.pack(">q", lifetime_ms)
        return _response(corr, _SASL_AUTHENTICATE, version, body + (b"\x00" if flex else b""))

    def failure(self) -> str:
        # Kafka's own words, so that clients and tests see what a real broker says.
        return (
            "Authentication failed during authentication due to invalid credentials with SASL "
            f"mechanism {self.mechanism}"
        )

    def logged_in(self) -> int:
        """Mark the login done; the session lifetime to announce (0: none)."""
        self.log(f"{self.user!r} logged in with {self.mechanism}")
        self.authenticated, self.mechanism, self.scram = True, None, None
        lifetime = self.cfg.session_lifetime_ms or 0
        self.expires = time.monotonic() + lifetime / 1000 if lifetime else None
        return lifetime

    async def raw_token(self, token: bytes) -> bool:
        """A bare token after SaslHandshake v0: answered bare; a failure closes the connection."""
        outcome = self.step(token)
        if outcome is None:
            return False
        reply, done = outcome
        # PLAIN answers its one token with an empty one, as Kafka's broker does.
        await self.pending.put(struct.pack(">i", len(reply)) + reply)
        if done:
            self.raw_tokens = False
            self.logged_in()
        return True

    def step(self, token: bytes) -> tuple[bytes, bool] | None:
        """One SASL step: (the server's token, whether the login is done), or None if refused."""
        import scramp  # here: the fixture side of this module needs it only in the front

        try:
            if self.mechanism == "PLAIN":
                authzid, user, password = token.decode().split("\x00")
                if authzid not in ("", user) or not self.plain_ok(user, password):
                    raise ValueError(f"PLAIN login refused for {user!r}")
                self.user = user
                return b"", True
            if self.scram is None:
                client_first = token.decode()
                user = _scram_user(client_first)
                self.user = user
                self.scram = scramp.ScramMechanism(self.mechanism).make_server(self.auth_info)
                self.scram.set_client_first(client_first)
                return self.scram.get_server_first().encode(), False
            self.scram.set_client_final(token.decode())
            return self.scram.get_server_final().encode(), True
        except (scramp.ScramException, ValueError, UnicodeDecodeError) as e:
            self.log(f"{self.mechanism} login refused for {self.user!r}: {e}")
            return None

    def auth_info(self, user: str) -> tuple[bytes, bytes, bytes, int] | None:
        return self.cfg.users.get(user, {}).get(str(self.mechanism))

    def plain_ok(self, user: str, password: str) -> bool:
        """Check a PLAIN password against the user's stored SCRAM-SHA-256 keys (no password is
        kept anywhere): derive them again with the stored salt, compare in constant time."""
        import scramp

        info = self.cfg.users.get(user, {}).get("SCRAM-SHA-256")
        if info is None:
            return False
        salt, stored_key, _, iterations = info
        derived = scramp.ScramMechanism("SCRAM-SHA-256").make_auth_info(password, iterations, salt)
        return hmac.compare_digest(derived[1], stored_key)

    client_r: asyncio.StreamReader  # set by _serve before requests() runs


def _scram_user(client_first: str) -> str:
    """The user a SCRAM client-first message names (``gs2-header n=user,r=nonce``), refusing
    an authorization id other than the user, as Kafka does; ``=2C``/``=3D`` decoded."""
    parts = client_first.split(",")
    if len(parts) < 4 or not parts[2].startswith("n="):
        raise ValueError("malformed SCRAM client-first message")
    user = parts[2][2:].replace("=2C", ",").replace("=3D", "=")
    if parts[1] not in ("", f"a={parts[2][2:]}"):
        raise ValueError("authorization id differs from the user")
    return user


async def _read_frame(reader: asyncio.StreamReader, limit: int) -> bytes | None:
    """The next size-prefixed frame, or None at a clean end of stream."""
    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise _Malformed("stream ended inside a size prefix") from e
        return None
    (size,) = struct.unpack(">i", head)
    if size < 0 or size > limit:
        raise _Malformed(f"frame of {size} bytes (limit {limit})")
    return await reader.readexactly(size)


async def _serve(cfg: _FrontConfig) -> None:
    active: set[asyncio.Task[Any]] = set()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(active) >= cfg.max_connections:
            client_w.close()
            return
        assert task is not None
        active.add(task)
        up_w: asyncio.StreamWriter | None = None
        try:
            up_r, upstream = await asyncio.wait_for(asyncio.open_connection(*cfg.upstream), 5)
            up_w = upstream
            conn = _Connection(cfg, client_w, up_r, upstream)
            conn.client_r = client_r
            reading = asyncio.create_task(conn.requests())
            writing = asyncio.create_task(conn.responses())
            done, _ = await asyncio.wait({reading, writing}, return_when=asyncio.FIRST_COMPLETED)
            if reading in done:
                if reading.exception() is not None:
                    conn.log(f"closed: {reading.exception()!r}")
                # Flush the answers still owed (an authentication error, say), then close.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(conn.pending.put(_CLOSE), 30)
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writing, 30)
            for t in (reading, writing):
                t.cancel()
            await asyncio.gather(reading, writing, return_exceptions=True)
        except (TimeoutError, OSError) as e:
            print(f"front: {e!r}", file=sys.stderr, flush=True)
        finally:
            for w in (client_w, up_w):
                if w is not None:
                    w.close()
            active.discard(task)

    server = await asyncio.start_server(handle, cfg.listen_host, cfg.listen_port, backlog=128)
    port = server.sockets[0].getsockname()[1]
    if cfg.advertise[1] == 0:
        cfg.advertise = (cfg.listen_host, port)  # no TLS in front: the front is the endpoint
    print(f"LISTENING {port}", flush=True)  # the one line the fixture waits for
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()
        server.close()
        for t in list(active):
            t.cancel()
        await asyncio.gather(*active, return_exceptions=True)


def _front_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="secure_kafka.py front")
    parser.add_argument("config", help="the JSON file a SecureKafka wrote (mode 0600)")
    cfg = _FrontConfig.load(parser.parse_args(argv).config)
    asyncio.run(_serve(cfg))
    return 0


# ---------------------------------------------------------------- the fixture


def _scram_users(users: Mapping[str, str]) -> dict[str, dict[str, list[Any]]]:
    """Each user's SCRAM keys for both hashes (PLAIN is checked against SHA-256's), as JSON."""
    import scramp

    out: dict[str, dict[str, list[Any]]] = {}
    for user, password in users.items():
        out[user] = {}
        for mech in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            salt, stored, server, iterations = scramp.ScramMechanism(mech).make_auth_info(
                password, _SCRAM_ITERATIONS
            )
            out[user][mech] = [salt.hex(), stored.hex(), server.hex(), iterations]
    return out


def _child_setup() -> None:
    """Between fork and exec: leave the terminal's Ctrl-C to the owner, and die with it."""
    from pipeline.cluster.processes import die_with_parent, leave_terminal_group

    leave_terminal_group()
    die_with_parent()


def _stop(proc: subprocess.Popen[bytes] | None, timeout_s: float = 5.0) -> None:
    """Stop one child by its pid: SIGTERM, wait, SIGKILL."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout_s)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _free_port() -> int:
    from pipeline.ingest.kafka.broker import free_port

    return free_port("127.0.0.1")


class StartError(RuntimeError):
    """A secured endpoint did not come up; the message names its log."""


class SecureKafka:
    """A plaintext embedded broker behind a secured endpoint on loopback, as a context manager.

    Args:
        folder: where certificates, configurations and logs go (a test's ``tmp_path``).
        mode: ``sasl_ssl`` (TLS, then SASL), ``sasl_plaintext``, ``ssl`` (TLS, no client
            identity) or ``mtls`` (TLS requiring a client certificate signed by ``pki.ca``).
        mechanisms: the SASL mechanisms offered, among :data:`MECHANISMS`.
        username, password: the user created (default: generated, the password by
            :mod:`secrets`); ``users`` adds more (name -> password).
        session_lifetime_ms: announced in SaslAuthenticate v1+ (KIP-368); the front closes a
            connection used after it without re-authenticating, as Kafka does. None: no limit.
        server_cert: which certificate the TLS endpoint presents: ``good``, or for negative
            tests ``other_ca``, ``wrong_name``, ``expired``; or a (cert, key) pair of paths.
        engine: the broker behind (``tansu`` or ``noida``, see ``EmbeddedBroker``).
        pki: certificates to reuse (default: :func:`make_pki` in ``folder/pki``).

    Attributes once started: ``bootstrap`` (the secured host:port), ``plain_bootstrap`` (the
    broker itself, PLAINTEXT, same data: for the "TLS client on a plaintext port" case and for
    throughput comparisons), ``front_bootstrap`` (the SASL front without TLS; it advertises
    ``bootstrap``), ``protocol``, ``pids``, ``username``, ``password``, ``pki``.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        mode: Mode = "sasl_ssl",
        mechanisms: Iterable[str] = MECHANISMS,
        username: str | None = None,
        password: str | None = None,
        users: Mapping[str, str] | None = None,
        session_lifetime_ms: int | None = None,
        server_cert: ServerCert | tuple[str | os.PathLike[str], str | os.PathLike[str]] = "good",
        engine: str = "tansu",
        pki: Pki | None = None,
    ) -> None:
        if mode not in PROTOCOLS:
            raise ValueError(f"mode {mode!r}: expected one of {', '.join(PROTOCOLS)}")
        self.mechanisms = tuple(mechanisms)
        unknown = set(self.mechanisms) - set(MECHANISMS)
        if unknown or not self.mechanisms:
            raise ValueError(
                f"mechanisms {sorted(unknown)}: expected some of {', '.join(MECHANISMS)}"
            )
        self.folder = Path(folder)
        self.mode = mode
        self.username = username or f"user-{secrets.token_hex(4)}"
        self.password = password or secrets.token_urlsafe(24)
        self.users = {self.username: self.password, **(users or {})}
        self.session_lifetime_ms = session_lifetime_ms
        self.server_cert = server_cert
        self.engine = engine
        self._pki = pki
        self._broker: Any = None
        self._front: subprocess.Popen[bytes] | None = None
        self._tls: subprocess.Popen[bytes] | None = None
        self.bootstrap = self.plain_bootstrap = self.front_bootstrap = ""
        self.startup_s = 0.0

    # --- what clients need

    @property
    def pki(self) -> Pki:
        if self._pki is None:
            self._pki = make_pki(self.folder / "pki")
        return self._pki

    @property
    def protocol(self) -> str:
        """Kafka's ``security.protocol`` for :attr:`bootstrap`."""
        return PROTOCOLS[self.mode]

    @property
    def sasl(self) -> bool:
        return self.mode.startswith("sasl")

    @property
    def tls(self) -> bool:
        return self.mode != "sasl_plaintext"

    @property
    def pids(self) -> dict[str, int]:
        """The running children by role: broker, front, tls (stunnel)."""
        procs = {"front": self._front, "tls": self._tls}
        out = {role: p.pid for role, p in procs.items() if p is not None and p.poll() is None}
        if self._broker is not None and self._broker.alive:
            out["broker"] = self._broker.pid
        return out

    def client_properties(
        self,
        *,
        mechanism: str | None = None,
        username: str | None = None,
        password: str | None = None,
        client_cert: bool | tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None,
        ca: str | os.PathLike[str] | None = None,
        verify_hostname: bool = True,
    ) -> dict[str, str]:
        """Client settings in Kafka's property names (librdkafka takes them as they are).

        ``client_cert``: True for ``pki.client_*``, False for none, or a (cert, key) pair;
        default: a certificate in ``mtls`` mode only. ``ca``: the CA file trusted (default
        ``pki.ca``). A wrong ``password``/``username`` makes a login fail, as tests want."""
        props = {"bootstrap.servers": self.bootstrap, "security.protocol": self.protocol}
        if self.sasl:
            props.update(
                {
                    "sasl.mechanism": mechanism or self.mechanisms[0],
                    "sasl.username": self.username if username is None else username,
                    "sasl.password": self.password if password is None else password,
                }
            )
        if self.tls:
            props["ssl.ca.location"] = str(ca or self.pki.ca)
            props["ssl.endpoint.identification.algorithm"] = "https" if verify_hostname else "none"
            pair = self._client_pair(client_cert)
            if pair:
                props["ssl.certificate.location"], props["ssl.key.location"] = map(str, pair)
        return props

    def _client_pair(
        self,
        client_cert: bool | tuple[str | os.PathLike[str], str | os.PathLike[str]] | None,
    ) -> tuple[str | os.PathLike[str], str | os.PathLike[str]] | None:
        if client_cert is None:
            client_cert = self.mode == "mtls"
        if client_cert is True:
            return self.pki.client_cert, self.pki.client_key
        return client_cert or None

    def write_client_properties(
        self, path: str | os.PathLike[str] | None = None, **settings: Any
    ) -> Path:
        """Write :meth:`client_properties` as a Java-style properties file (mode 0600: it
        holds a password) and return its path (default ``folder/client.properties``)."""
        target = Path(path) if path is not None else self.folder / "client.properties"
        lines = [
            f"{k}={_escape_property(v)}" for k, v in self.client_properties(**settings).items()
        ]
        _write_private(target, ("\n".join(lines) + "\n").encode())
        return target

    def confluent_conf(self, **settings: Any) -> dict[str, Any]:
        """A confluent-kafka (librdkafka) configuration: :meth:`client_properties` (same
        keyword arguments), merged with ``extra={...}`` (any librdkafka property)."""
        extra = settings.pop("extra", None) or {}
        return {**self.client_properties(**settings), **extra}

    def kafka_python_kwargs(
        self,
        *,
        mechanism: str | None = None,
        username: str | None = None,
        password: str | None = None,
        client_cert: bool | tuple[str | os.PathLike[str], str | os.PathLike[str]] | None = None,
        ca: str | os.PathLike[str] | None = None,
        verify_hostname: bool = True,
    ) -> dict[str, Any]:
        """The same settings for kafka-python's KafkaProducer/KafkaConsumer/KafkaAdminClient."""
        kw: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.protocol,
        }
        if self.sasl:
            kw.update(
                sasl_mechanism=mechanism or self.mechanisms[0],
                sasl_plain_username=self.username if username is None else username,
                sasl_plain_password=self.password if password is None else password,
            )
        if self.tls:
            kw.update(ssl_cafile=str(ca or self.pki.ca), ssl_check_hostname=verify_hostname)
            pair = self._client_pair(client_cert)
            if pair:
                kw.update(ssl_certfile=str(pair[0]), ssl_keyfile=str(pair[1]))
        return kw

    def ssl_context(self, *, client_cert: bool | None = None) -> ssl.SSLContext:
        """A client SSLContext trusting ``pki.ca`` (kafka-python's ``ssl_context=``)."""
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        pair = self._client_pair(client_cert)
        if pair:
            ctx.load_cert_chain(str(pair[0]), str(pair[1]))
        return ctx

    # --- lifecycle

    def start(self, timeout_s: float = 20.0) -> SecureKafka:
        """Start the broker, the front and (unless sasl_plaintext) stunnel; return when a
        request has gone through the whole chain. Raises :class:`StartError`."""
        from pipeline.ingest.kafka.broker import EmbeddedBroker

        if self._broker is not None:
            return self
        began = time.monotonic()
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.tls:
            _ = self.pki  # certificates first: they are not timed as startup
            began = time.monotonic()
        try:
            self._broker = EmbeddedBroker(
                engine=self.engine, log_path=self.folder / "broker.log"
            ).start(timeout_s)
            self.plain_bootstrap = self._broker.bootstrap
            # A port probed free can be taken before stunnel binds it; it is advertised by the
            # front, so a new try restarts both.
            for attempt in range(3):
                if self._start_front_and_tls(time.monotonic() + timeout_s, attempt):
                    break
            else:
                raise StartError(f"the secured endpoint did not come up; logs in {self.folder}")
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - began
        return self

    def _start_front_and_tls(self, deadline: float, attempt: int) -> bool:
        _stop(self._tls)
        _stop(self._front)
        self._tls = self._front = None
        public = _free_port() if self.tls else 0
        broker_host, broker_port = self.plain_bootstrap.rsplit(":", 1)
        config = {
            "listen_host": "127.0.0.1",
            "listen_port": 0,
            "upstream": [broker_host, int(broker_port)],
            "advertise": ["127.0.0.1", public],
            "sasl": self.sasl,
            "mechanisms": list(self.mechanisms),
            "users": _scram_users(self.users) if self.sasl else {},
            "session_lifetime_ms": self.session_lifetime_ms,
        }
        front_port = self._spawn_front(config, deadline)
        if not self.tls:
            # The front is the endpoint: told port 0 to advertise, it advertises its own.
            self.bootstrap = self.front_bootstrap = f"127.0.0.1:{front_port}"
            return self._probe_until(deadline, tls=False)
        self.front_bootstrap = f"127.0.0.1:{front_port}"
        cert, key = (
            self.pki.server_pair(self.server_cert)
            if isinstance(self.server_cert, str)
            else self.server_cert
        )
        lines = [
            "foreground = yes",
            "pid =",
            "syslog = no",
            "debug = notice",
            "",
            "[kafka]",
            f"accept = 127.0.0.1:{public}",
            f"connect = {self.front_bootstrap}",
            f"cert = {cert}",
            f"key = {key}",
            "sslVersionMin = TLSv1.2",
            "socket = l:TCP_NODELAY=1",
            "socket = r:TCP_NODELAY=1",
        ]
        if self.mode == "mtls":
            lines += ["verifyChain = yes", "requireCert = yes", f"CAfile = {self.pki.ca}"]
        conf = self.folder / f"stunnel-{attempt}.conf"
        conf.write_text("\n".join(lines) + "\n")
        with open(self.folder / "stunnel.log", "ab") as log:
            self._tls = subprocess.Popen(
                ["stunnel4", str(conf)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=_child_setup,
            )
        self.bootstrap = f"127.0.0.1:{public}"
        return self._probe_until(deadline, tls=True)

    def _spawn_front(self, config: dict[str, Any], deadline: float) -> int:
        """Start the front and return the port it says it listens on."""
        path = self.folder / "front.json"
        _write_private(path, json.dumps(config).encode())  # it holds the users' SCRAM keys
        with open(self.folder / "front.log", "ab") as log:
            self._front = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "front", str(path)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                preexec_fn=_child_setup,
            )
        assert self._front.stdout is not None
        line = b""
        while (
            not line.endswith(b"\n") and time.monotonic() < deadline and self._front.poll() is None
        ):
            ready, _, _ = select.select(
                [self._front.stdout], [], [], max(0.0, deadline - time.monotonic())
            )
            if ready:
                chunk = os.read(self._front.stdout.fileno(), 256)
                if not chunk:
                    break
                line += chunk
        self._front.stdout.close()  # it writes nothing more there
        self._front.stdout = None
        if not line.startswith(b"LISTENING "):
            raise StartError(f"the SASL front did not start (log: {self.folder / 'front.log'})")
        return int(line.split()[1])

    def _probe_until(self, deadline: float, *, tls: bool) -> bool:
        """Send ApiVersions through the chain until it answers (True), or a child exits or
        the deadline passes (False)."""
        host, port = self.bootstrap.rsplit(":", 1)
        while time.monotonic() < deadline:
            if any(p is not None and p.poll() is not None for p in (self._front, self._tls)):
                return False
            with contextlib.suppress(OSError):
                _api_versions_probe(host, int(port), self._probe_context() if tls else None)
                return True
            time.sleep(0.02)  # a retry step of the bounded wait above
        return False

    def _probe_context(self) -> ssl.SSLContext:
        # Readiness only: the certificate may be a deliberately bad one (expired, wrong name).
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        if self.mode == "mtls":
            ctx.load_cert_chain(str(self.pki.client_cert), str(self.pki.client_key))
        return ctx

    def stop(self) -> None:
        """Stop stunnel, the front and the broker, by pid, in that order."""
        _stop(self._tls)
        _stop(self._front)
        self._tls = self._front = None
        broker, self._broker = self._broker, None
        if broker is not None:
            broker.stop()

    def __enter__(self) -> SecureKafka:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _escape_property(value: str) -> str:
    """A value as a Java properties file reads it back (backslash escapes)."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")


def _api_versions_probe(
    host: str, port: int, ctx: ssl.SSLContext | None, timeout_s: float = 2.0
) -> None:
    """One ApiVersions v0 request and its answer; raises OSError if the chain is not up."""
    client_id = b"secure-kafka-probe"
    request = struct.pack(">hhih", _API_VERSIONS, 0, 7, len(client_id)) + client_id
    with socket.create_connection((host, port), timeout_s) as raw:
        sock: socket.socket = ctx.wrap_socket(raw, server_hostname=host) if ctx else raw
        sock.sendall(struct.pack(">i", len(request)) + request)
        head = _recv_exactly(sock, 8)
        size, corr = struct.unpack(">ii", head)
        if corr != 7 or not 0 < size <= _MAX_SASL_FRAME:
            raise OSError(f"unexpected ApiVersions answer (size {size}, correlation id {corr})")
        _recv_exactly(sock, size - 4)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:  # bounded: each recv blocks at most the socket's timeout, and EOF raises
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data


if __name__ == "__main__":
    # The front, as SecureKafka starts it: ``python secure_kafka.py front CONFIG``.
    if sys.argv[1:2] != ["front"]:
        sys.exit("usage: secure_kafka.py front CONFIG  (started by SecureKafka; not a test)")
    sys.exit(_front_main(sys.argv[2:]))
