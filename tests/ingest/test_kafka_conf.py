"""The Kafka client configuration file: read in Kafka's property names, checked in one line,
its secrets kept out of every repr, and translated for each client kind (no broker needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.ingest.kafka import conf, security

SCRAM = (
    "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=trainer\n"
    "sasl.password={}\n"
)


def _write(folder: Path, text: str, mode: int = 0o600, name: str = "client.properties") -> Path:
    path = folder / name
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_scram_file_reads_into_every_client_kind(tmp_path: Path) -> None:
    path = _write(tmp_path, SCRAM.format("p4ss-word"))
    c = conf.load(path)
    assert (c.protocol, c.mechanism, c.username, c.password) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "trainer",
        "p4ss-word",
    )
    kp = c.kafka_python()
    assert kp["security_protocol"] == "SASL_SSL" and kp["sasl_plain_password"] == "p4ss-word"
    assert kp["ssl_context"].check_hostname and kp["ssl_check_hostname"]
    assert c.librdkafka()["ssl.endpoint.identification.algorithm"] == "https"
    spark = c.spark_options()
    # Spark's plan carries the path, never the password: its Java client reads the file itself.
    assert (
        "p4ss-word" not in repr(spark)
        and f"${{file:{path}:sasl.password}}" in spark["kafka.sasl.jaas.config"]
    )
    assert "p4ss-word" not in repr(c) and "p4ss-word" not in c.describe()


def test_a_file_readable_by_others_is_refused_when_it_holds_a_password(tmp_path: Path) -> None:
    path = _write(tmp_path, SCRAM.format("x"), mode=0o644)
    with pytest.raises(
        ConfigError, match=r"readable by its owner only: it holds a password.*chmod 600"
    ):
        conf.load(path)
    # Without a secret in it, a file may be shared (mutual TLS: the key file is checked instead).
    shared = _write(tmp_path, "security.protocol=SSL\n", mode=0o644, name="tls.properties")
    assert conf.load(shared).protocol == "SSL"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "security.protocol=SASL_SSL\nsasl.mechanism=GSSAPI\nsasl.username=u\nsasl.password=p\n",
            "Expected sasl.mechanism PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
        ),
        (
            "security.protocol=TLS\n",
            "Expected security.protocol PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL",
        ),
        (
            "security.protocol=SASL_SSL\nsasl.mechanism=PLAIN\nsasl.username=u\n",
            "Expected sasl.password",
        ),
        ("sasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=p\n", "beside sasl.* settings"),
        (
            "security.protocol=SASL_PLAINTEXT\nssl.ca.location=/etc/hostname\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=p\n",
            "the connection would not use TLS",
        ),
        ("security.protocol=SSL\nssl.ca.location=/nonexistent/ca.pem\n", "to name a readable file"),
        ("security.protocol=SSL\nssl.ca.location=/etc/hostname\n", "to hold PEM certificates"),
        (
            "security.protocol=SSL\nssl.endpoint.identification.algorithm=maybe\n",
            "https \\(the default\\) or empty",
        ),
        ("security.protocol=SSL\nssl.keystore.password=p\n", "Received: ssl.keystore.password"),
        (
            "security.protocol=SSL\nsasl.pasword secret\n",
            "Received: sasl.pasword. Remove",
        ),  # a typo: never ignored
    ],
)
def test_a_bad_file_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as e:
        conf.load(path)
    assert (
        "\n" not in str(e.value)
        and "sasl.password=p" not in str(e.value)
        and "secret" not in str(e.value)
    )


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Expected a readable Kafka client properties file"):
        conf.load(tmp_path / "nope.properties")


def test_the_java_clients_jaas_line_and_librdkafkas_names_are_read(tmp_path: Path) -> None:
    # A managed service's download: bootstrap.servers, PLAIN in a JAAS line, librdkafka's plural.
    path = _write(
        tmp_path,
        "bootstrap.servers=broker.example:9092\nsecurity.protocol=SASL_SSL\n"
        "sasl.mechanisms=PLAIN\nsession.timeout.ms=45000\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        "username='KEY' password='SECRET';\n",
    )
    c = conf.load(path)
    assert (c.bootstrap, c.mechanism, c.username, c.password) == (
        "broker.example:9092",
        "PLAIN",
        "KEY",
        "SECRET",
    )
    # Spark's own source reads the file's own JAAS line (it has no sasl.username to refer to).
    assert c.spark_options()["kafka.sasl.jaas.config"] == f"${{file:{path}:sasl.jaas.config}}"


def test_a_password_rotated_in_the_file_is_read_by_the_next_client(tmp_path: Path) -> None:
    path = _write(tmp_path, SCRAM.format("first"))
    assert conf.load(path).password == "first"
    assert conf.load(path) is conf.load(path)  # unchanged: read once per process
    path.write_text(SCRAM.format("second"))
    os.utime(path, ns=(1, 1))  # a rotation within the same clock tick must still be seen
    assert conf.load(path).password == "second"


def test_plaintext_is_the_default() -> None:
    assert conf.load(None) is security.PLAINTEXT
    assert security.PLAINTEXT.kafka_python() == {"security_protocol": "PLAINTEXT"}
    assert security.PLAINTEXT.ssl_context() is None
