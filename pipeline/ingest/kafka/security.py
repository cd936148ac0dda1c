"""The security settings of a process's Kafka connections (:class:`KafkaConf`), and their
translation for every kind of client streamtrain builds: kafka-python's arguments, an
:class:`ssl.SSLContext` for the Fetch reader, librdkafka's dict and Spark's
``kafka.``-prefixed source options.

:func:`pipeline.ingest.kafka.conf.load` reads and checks the file a :class:`KafkaConf` comes
from; a :class:`KafkaConf` holds the file's *path*, never hands its secrets to a plan.
"""

from __future__ import annotations

import dataclasses
import functools
import ssl
from typing import Any

from pipeline.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class KafkaConf:
    """Security settings of every Kafka connection of a process (PLAINTEXT when empty).

    The password fields are left out of ``repr`` (and so of every log line and error).

    Example:

    >>> conf = KafkaConf(protocol="SASL_SSL", mechanism="SCRAM-SHA-512", username="alice",
    ...                  password="s3cret")
    >>> conf
    KafkaConf(path=None, protocol='SASL_SSL', mechanism='SCRAM-SHA-512', username='alice', ...)
    >>> conf.describe()
    'SASL_SSL, SCRAM-SHA-512 as alice'
    >>> sorted(conf.kafka_python())[:4]
    ['sasl_mechanism', 'sasl_plain_password', 'sasl_plain_username', 'security_protocol']
    """

    path: str | None = None
    protocol: str = "PLAINTEXT"
    mechanism: str | None = None
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    ca: str | None = None
    certificate: str | None = None
    key: str | None = None
    key_password: str | None = dataclasses.field(default=None, repr=False)
    verify_hostname: bool = True
    bootstrap: str | None = None
    #: Whether the file holds the credentials as the Java client's ``sasl.jaas.config`` line
    #: (then Spark's own source refers to that line, not to ``sasl.username``/``sasl.password``).
    jaas: bool = False

    def __repr__(self) -> str:
        shown = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.repr}
        head = ", ".join(f"{k}={v!r}" for k, v in list(shown.items())[:4])
        return f"KafkaConf({head}, ...)"

    @property
    def tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    def describe(self) -> str:
        """The settings in a few words, with no secret in them (for logs and errors)."""
        parts = [self.protocol]
        if self.sasl:
            parts.append(f"{self.mechanism} as {self.username}")
        if self.certificate:
            parts.append(f"client certificate {self.certificate}")
        return ", ".join(parts)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of a connection (None for PLAINTEXT and SASL_PLAINTEXT): the
        CA's certificates (the system's when no ``ssl.ca.location``), the broker's name
        checked unless ``ssl.endpoint.identification.algorithm`` is empty, and the client's
        certificate for mutual TLS."""
        if not self.tls:
            return None
        return _context(
            self.ca, self.certificate, self.key, self.key_password, self.verify_hostname
        )

    def kafka_python(self) -> dict[str, Any]:
        """kafka-python's keyword arguments (``KafkaProducer``, ``KafkaConsumer``,
        ``KafkaAdminClient``)."""
        args: dict[str, Any] = {"security_protocol": self.protocol}
        if self.tls:
            args.update(ssl_context=self.ssl_context(), ssl_check_hostname=self.verify_hostname)
        if self.sasl:
            args.update(
                sasl_mechanism=self.mechanism,
                sasl_plain_username=self.username,
                sasl_plain_password=self.password,
            )
        return args

    def librdkafka(self) -> dict[str, Any]:
        """confluent-kafka's (librdkafka's) configuration dict."""
        out: dict[str, Any] = {"security.protocol": self.protocol}
        if self.sasl:
            out.update(
                {
                    "sasl.mechanism": self.mechanism,
                    "sasl.username": self.username,
                    "sasl.password": self.password,
                }
            )
        if self.tls:
            out["ssl.endpoint.identification.algorithm"] = (
                "https" if self.verify_hostname else "none"
            )
            for key, value in (
                ("ssl.ca.location", self.ca),
                ("ssl.certificate.location", self.certificate),
                ("ssl.key.location", self.key),
                ("ssl.key.password", self.key_password),
            ):
                if value:
                    out[key] = value
        return out

    def spark_options(self) -> dict[str, str]:
        """Options for Spark's own Kafka source (``format("kafka")``, the spark-sql-kafka jar).

        The Java client reads the secrets from the same file, through Kafka's
        ``FileConfigProvider`` (``${file:PATH:KEY}``), so the plan holds the path alone.

        >>> KafkaConf(path="/etc/k.properties", protocol="SASL_SSL", mechanism="PLAIN",
        ...           username="u", password="p").spark_options()["kafka.sasl.jaas.config"]
        ... # doctest: +NORMALIZE_WHITESPACE
        'org.apache.kafka.common.security.plain.PlainLoginModule required
        username="${file:/etc/k.properties:sasl.username}"
        password="${file:/etc/k.properties:sasl.password}";'
        """
        out = {"kafka.security.protocol": self.protocol}
        if self.protocol == "PLAINTEXT":
            return out
        ref = functools.partial("${{file:{}:{}}}".format, self.path)
        out.update(
            {
                "kafka.config.providers": "file",
                "kafka.config.providers.file.class": (
                    "org.apache.kafka.common.config.provider.FileConfigProvider"
                ),
            }
        )
        if self.sasl:
            module = (
                "plain.PlainLoginModule" if self.mechanism == "PLAIN" else "scram.ScramLoginModule"
            )
            out["kafka.sasl.mechanism"] = self.mechanism or ""
            out["kafka.sasl.jaas.config"] = (
                ref("sasl.jaas.config")
                if self.jaas
                else f"org.apache.kafka.common.security.{module} required "
                f'username="{ref("sasl.username")}" password="{ref("sasl.password")}";'
            )
        if self.tls:
            out["kafka.ssl.endpoint.identification.algorithm"] = (
                "https" if self.verify_hostname else ""
            )
            if self.ca:
                out.update(
                    {"kafka.ssl.truststore.type": "PEM", "kafka.ssl.truststore.location": self.ca}
                )
            if self.certificate:
                if self.certificate != self.key:
                    raise ConfigError(
                        "Expected ssl.certificate.location and ssl.key.location to be one PEM "
                        "file for Spark's own Kafka source (its Java client reads a client "
                        "certificate and key from one keystore). "
                        f"Received: {self.certificate} and {self.key}. "
                        "Concatenate them into one file (cat CERT KEY > client.pem; chmod 600) "
                        "and name it in both."
                    )
                out.update(
                    {
                        "kafka.ssl.keystore.type": "PEM",
                        "kafka.ssl.keystore.location": self.certificate,
                    }
                )
                if self.key_password:
                    out["kafka.ssl.key.password"] = ref("ssl.key.password")
        return out


PLAINTEXT = KafkaConf()


@functools.lru_cache(maxsize=16)
def _context(
    ca: str | None,
    certificate: str | None,
    key: str | None,
    key_password: str | None,
    verify_hostname: bool,
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = verify_hostname
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if certificate:
        ctx.load_cert_chain(certificate, key, password=key_password)
    return ctx
