"""One connection to a Kafka broker, as the Fetch reader speaks it: length-prefixed
requests and responses one at a time, over TLS when the client configuration asks for
it, authenticated with SASL (PLAIN or SCRAM) before the first request.

TLS is Python's :mod:`ssl` (OpenSSL) with the broker's name checked against its
certificate unless the configuration turns that off. SASL is Kafka's own framing
(SaslHandshake v1, then SaslAuthenticate v1 carrying the mechanism's messages); the
mechanisms' exchanges are kafka-python's (its SCRAM client does the salting and proofs),
so no cryptography is written here. When the broker grants a session lifetime (KIP-368),
the connection authenticates again before it ends.

Failures that a retry cannot mend (a refused password, a certificate that does not
verify, a peer that does not speak TLS or Kafka) raise :class:`AuthenticationError` at
once, with the broker, the user and the mechanism named; a broker that cannot be reached
raises :class:`ConnectionLost`, which readers retry, and so is one that takes the
connection but does not finish its handshake in time (:class:`SlowAnswer`): a busy broker's
first TLS handshake is not a wrong setting.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time
from typing import Any

from pipeline.errors import BrokerError
from pipeline.ingest.kafka.security import PLAINTEXT, KafkaConf

_SASL_HANDSHAKE, _SASL_AUTHENTICATE = 17, 36
#: How long a TLS handshake or SASL exchange may take (the Java client's default for a
#: connection's set-up). Past it the peer is busy, or will never finish one (a TLS client
#: at another broker's plaintext port may wait for a ServerHello that never comes).
HANDSHAKE_TIMEOUT_S = 10.0
#: Authenticate again once this share of the broker's session lifetime has passed.
_REAUTH_AT = 0.85

#: The largest response to a request other than a Fetch (metadata of a large cluster).
MAX_RESPONSE_BYTES = 16 << 20
#: The largest response declared that a cut (``cut_at``) reads the start of: past it, a size
#: is no broker's answer (noida-db's whole log from an offset stays under it up to 1 GiB of
#: records in a partition) but a peer that does not speak Kafka.
MAX_CUT_RESPONSE_BYTES = 1 << 30


class ConnectionLost(BrokerError):
    """A broker could not be reached or dropped the connection (worth retrying)."""


class SlowAnswer(ConnectionLost):
    """A broker took the connection but did not answer in time (worth retrying: a busy
    broker's first TLS handshake and SCRAM exchange have taken over 5 s on two cores)."""


class AuthenticationError(BrokerError):
    """A broker refused this client, or this client refused the broker (never retried:
    the same settings fail the same way)."""


def string(s: str | None) -> bytes:
    """A Kafka STRING (int16 length, then UTF-8; -1 for null).

    >>> string("ab"), string(None)
    (b'\\x00\\x02ab', b'\\xff\\xff')
    """
    if s is None:
        return struct.pack(">h", -1)
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


class Reader:
    """Big-endian fields from a response, in order; ``cut``: the response was cut short
    (:meth:`Connection.request`'s ``cut_at``), so its last bytes field holds what arrived.

    >>> r = Reader(struct.pack(">i", 5) + b"abc", cut=True)
    >>> bytes(r.bytes_())
    b'abc'
    """

    def __init__(self, data: bytes | bytearray, *, cut: bool = False) -> None:
        self.data, self.pos, self.cut = data, 0, cut

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str | None:
        n = self.take(">h")
        if n < 0:
            return None
        value = self.data[self.pos : self.pos + n].decode()
        self.pos += n
        return value

    def bytes_(self) -> memoryview | None:
        n = self.take(">i")
        if n < 0:
            return None
        if self.pos + n > len(self.data):
            if not self.cut:
                raise ValueError(f"a field of {n} bytes where {len(self.data) - self.pos} remain")
            n = len(self.data) - self.pos
        value = memoryview(self.data)[self.pos : self.pos + n]
        self.pos += n
        return value


def _tls_failure(e: ssl.SSLError, where: str, conf: KafkaConf) -> AuthenticationError:
    """One line for a TLS handshake that failed, saying which side refused what."""
    if isinstance(e, ssl.SSLCertVerificationError):
        why = e.verify_message or str(e)
        fix = (
            "ssl.ca.location must name the CA that signed the broker's certificate"
            if "issuer" in why or "self-signed" in why or "self signed" in why
            else "the broker's certificate must name the host in --bootstrap (or set "
            "ssl.endpoint.identification.algorithm= to skip the name check, on a network you trust)"
            if "hostname" in why or "IP address" in why
            else "the broker's certificate must be renewed"
            if "expired" in why
            else "check ssl.ca.location"
        )
        return AuthenticationError(
            f"The Kafka broker at {where} presented a certificate that does not verify "
            f"({why}): {fix}."
        )
    reason = e.reason or type(e).__name__
    if reason in (
        "WRONG_VERSION_NUMBER",
        "UNEXPECTED_EOF_WHILE_READING",
        "RECORD_LAYER_FAILURE",
    ) or isinstance(e, ssl.SSLEOFError):
        return AuthenticationError(
            f"The Kafka broker at {where} does not speak TLS ({reason}): its port is "
            f"probably PLAINTEXT or SASL_PLAINTEXT, not {conf.protocol}. Check "
            "security.protocol in --kafka-conf against the listener's."
        )
    if (
        "CERTIFICATE" in reason.upper()
        or "ALERT" in reason.upper()
        or "HANDSHAKE_FAILURE" in reason.upper()
    ):
        return AuthenticationError(
            f"The Kafka broker at {where} refused this client's TLS handshake ({reason}): "
            "it wants a client certificate it trusts (ssl.certificate.location and "
            "ssl.key.location in --kafka-conf)."
        )
    return AuthenticationError(f"TLS with the Kafka broker at {where} failed ({reason}).")


class Connection:
    """One broker connection: TLS and SASL as ``conf`` says, then requests one at a time.

    Example (needs a broker, so not run here)::

        conn = Connection("127.0.0.1", 9093, 10.0, conf.load("client.properties"))
        reader = conn.request(3, 4, body)
    """

    def __init__(
        self,
        host: str,
        port: int,
        timeout_s: float,
        conf: KafkaConf = PLAINTEXT,
        *,
        handshake_s: float | None = None,
    ) -> None:
        """Connect, then TLS and SASL within ``handshake_s`` (default: ``timeout_s`` up to
        :data:`HANDSHAKE_TIMEOUT_S`); requests then wait ``timeout_s``."""
        self.where, self.conf, self.timeout_s = f"{host}:{port}", conf, timeout_s
        handshake_s = min(timeout_s, HANDSHAKE_TIMEOUT_S) if handshake_s is None else handshake_s
        try:
            sock = socket.create_connection((host, port), timeout=min(timeout_s, handshake_s))
        except OSError as e:
            raise ConnectionLost(
                f"Cannot connect to the Kafka broker at {host}:{port} ({e})."
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock: socket.socket = sock
        self.correlation = 0
        self._reauth_at = float("inf")
        try:
            sock.settimeout(handshake_s)
            context = conf.ssl_context()
            if context is not None:
                try:
                    self.sock = context.wrap_socket(sock, server_hostname=host)
                except ssl.SSLError as e:
                    raise _tls_failure(e, self.where, conf) from None
                except TimeoutError:
                    raise SlowAnswer(
                        f"The Kafka broker at {self.where} took the connection but did not "
                        f"finish a TLS handshake within {handshake_s:g} s: it is busy, or its "
                        f"port is not {conf.protocol} (check security.protocol in --kafka-conf)."
                    ) from None
                except OSError as e:  # reset while handshaking: a peer that does not speak TLS here
                    raise AuthenticationError(
                        f"The Kafka broker at {self.where} closed the TLS handshake ({e}): "
                        f"check security.protocol {conf.protocol} against the listener, and "
                        "the client certificate if the broker asks for one."
                    ) from None
            if conf.sasl:
                self._authenticate()
            self.sock.settimeout(timeout_s)
        except BaseException:
            self.sock.close()
            raise

    def request(
        self,
        api_key: int,
        version: int,
        body: bytes,
        *,
        most: int = MAX_RESPONSE_BYTES,
        cut_at: int | None = None,
    ) -> Reader:
        """Send a request; its response, which may be at most ``most`` bytes: a frame size
        decides no allocation beyond what the request asked for. With ``cut_at``, a longer
        response is read to ``cut_at`` bytes and the connection closed (the Reader says
        ``cut``): for a broker that sends more than a Fetch asked for (noida-db sends the
        log from the offset to its end), where reading on would cost memory and time for
        records nobody asked for, and failing would stop a run with a backlog."""
        if time.monotonic() >= self._reauth_at:
            self.sock.settimeout(min(self.timeout_s, HANDSHAKE_TIMEOUT_S))
            self._authenticate()
            self.sock.settimeout(self.timeout_s)
        return self._request(api_key, version, body, most=most, cut_at=cut_at)

    def _request(
        self,
        api_key: int,
        version: int,
        body: bytes,
        *,
        most: int = MAX_RESPONSE_BYTES,
        cut_at: int | None = None,
    ) -> Reader:
        self.correlation += 1
        header = struct.pack(">hhi", api_key, version, self.correlation) + string("streamtrain")
        frame = header + body
        try:
            self.sock.sendall(struct.pack(">i", len(frame)) + frame)
            size = struct.unpack(">i", self._read(4))[0]
            cut = cut_at is not None and 4 <= cut_at < size <= MAX_CUT_RESPONSE_BYTES
            if cut:
                assert cut_at is not None
                data = self._read(cut_at)
                self.sock.close()  # the rest is still on its way: this connection is spent
            elif not 4 <= size <= most:
                raise self._garbled(
                    f"Kafka's response declares {size} bytes, outside 4 to {most:,} for what was "
                    "asked: the broker (or something between) does not speak Kafka's protocol here."
                )
            else:
                data = self._read(size)
        except (ssl.SSLEOFError, ConnectionLost) as e:
            if self.correlation == 1 and self.conf.tls:
                raise self._refused_after_handshake() from None
            raise ConnectionLost(f"Kafka request failed ({type(e).__name__}: {e}).") from None
        except (
            ssl.SSLError
        ) as e:  # TLS 1.3 sends a refused client certificate's alert after the handshake
            raise _tls_failure(e, self.where, self.conf) from None
        except TimeoutError:
            raise SlowAnswer(
                f"The Kafka broker at {self.where} did not answer within "
                f"{self.sock.gettimeout():g} s."
            ) from None
        except OSError as e:
            raise ConnectionLost(f"Kafka request failed ({type(e).__name__}: {e}).") from None
        if struct.unpack_from(">i", data)[0] != self.correlation:
            raise BrokerError(
                "Kafka answered a different request than the one sent (correlation id mismatch)."
            )
        reader = Reader(data, cut=cut)
        reader.pos = 4
        return reader

    def _refused_after_handshake(self) -> AuthenticationError:
        """A TLS listener that closes at the first request after the handshake: with TLS 1.3 a
        server checks the client's certificate after the client's handshake is done."""
        which = (
            "refused the client certificate given"
            if self.conf.certificate
            else "probably requires a client certificate (ssl.certificate.location and "
            "ssl.key.location in --kafka-conf)"
        )
        return AuthenticationError(
            f"The Kafka broker at {self.where} closed the TLS connection at the first request: "
            f"it {which}."
        )

    def _garbled(self, message: str) -> BrokerError:
        if self.conf.protocol == "PLAINTEXT" and self.correlation == 1:
            # A TLS listener answers a plaintext request with an alert (0x15 0x03 ...), read as a
            # huge size.
            return AuthenticationError(
                f"The Kafka broker at {self.where} did not answer in Kafka's plaintext "
                "protocol: its port probably wants TLS (security.protocol SSL or "
                "SASL_SSL in a --kafka-conf file)."
            )
        return BrokerError(message)

    def _authenticate(self) -> None:
        """SaslHandshake v1, then the mechanism's messages in SaslAuthenticate v1 requests."""
        from kafka.net.sasl import get_sasl_mechanism

        conf = self.conf
        who = f"user {conf.username!r} with SASL {conf.mechanism}"
        first = self.correlation == 0  # else a re-authentication: a dropped connection is only that
        try:
            r = self._request(_SASL_HANDSHAKE, 1, string(conf.mechanism))
            error = r.take(">h")
            offered = [r.string() for _ in range(max(r.take(">i"), 0))]
        except (AuthenticationError, SlowAnswer):
            raise
        except ConnectionLost:
            if not first:
                raise
            raise AuthenticationError(
                f"The Kafka broker at {self.where} closed the connection at the SASL "
                f"handshake: its port is probably not {conf.protocol}. Check "
                "security.protocol in --kafka-conf against the listener's."
            ) from None
        except (BrokerError, struct.error) as e:
            raise AuthenticationError(
                f"The Kafka broker at {self.where} did not take a SASL handshake ({e}): its "
                f"port is probably not {conf.protocol}. Check security.protocol in "
                "--kafka-conf against the listener's."
            ) from None
        if error:
            raise AuthenticationError(
                f"The Kafka broker at {self.where} does not offer SASL {conf.mechanism} (it "
                f"offers {', '.join(m for m in offered if m) or 'none'}). Set sasl.mechanism "
                "in --kafka-conf to one of those."
            )
        mechanism = get_sasl_mechanism(conf.mechanism)(
            security_protocol=conf.protocol,
            sasl_mechanism=conf.mechanism,
            sasl_plain_username=conf.username,
            sasl_plain_password=conf.password,
        )
        lifetime_ms = 0
        while not mechanism.is_done():
            try:
                r = self._request(_SASL_AUTHENTICATE, 1, _bytes(mechanism.auth_bytes()))
                error, message, answer = r.take(">h"), r.string(), r.bytes_()
                lifetime_ms = r.take(">q")
            except SlowAnswer:
                raise
            except ConnectionLost as e:
                if not first:
                    raise
                raise AuthenticationError(
                    f"The Kafka broker at {self.where} closed the connection while "
                    f"authenticating {who} ({e})."
                ) from None
            if error:
                raise AuthenticationError(
                    f"The Kafka broker at {self.where} refused {who}: {message or error}. "
                    "Check sasl.username and sasl.password in --kafka-conf."
                )
            try:
                mechanism.receive(bytes(answer or b""))
            except ValueError as e:  # a SCRAM server whose proof does not verify
                raise AuthenticationError(
                    f"The Kafka broker at {self.where} failed SASL {conf.mechanism}'s check "
                    f"of the server ({e}): it may not be the broker you meant."
                ) from None
        if not mechanism.is_authenticated():
            raise AuthenticationError(
                f"The Kafka broker at {self.where} did not authenticate {who}."
            )
        self._reauth_at = (
            (time.monotonic() + _REAUTH_AT * lifetime_ms / 1000)
            if lifetime_ms > 0
            else float("inf")
        )

    def _read(self, n: int) -> bytearray:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:], n - got)
            if not k:
                raise ConnectionLost("The Kafka broker closed the connection.")
            got += k
        return buf

    def close(self) -> None:
        self.sock.close()


def _bytes(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data
