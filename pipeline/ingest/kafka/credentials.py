"""A secured Kafka's credentials for a deployment, made on its first start: a CA, the
broker's TLS certificate, a SCRAM-SHA-512 user, the broker's properties that require
both, and the client file streamtrain's services read (``--kafka-conf``).

The compose stack's secured variant (``deploy/kafka-secured.yml``) runs
``streamtrain secrets --kafka-broker DIR --kafka-client FILE`` once: the broker's files go
into a volume only the broker mounts (mode 0644: it runs as another user), the client
file (mode 0600) and the CA's certificate into the one streamtrain's services mount.
Later starts keep them. The CA's key signs the broker's certificate and is then dropped:
nothing here can sign another.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import os
import secrets
import uuid
from pathlib import Path

from pipeline.errors import ConfigError

#: The user streamtrain's services log in as.
USER = "streamtrain"
#: Names the broker's certificate holds: its service name on the stack's network, and the
#: host's loopback where the stack publishes its port.
BROKER_NAMES = ("kafka", "localhost")
#: The broker's listeners: SASL_SSL for the stack (9092) and the host (9094), the KRaft
#: controller and a PLAINTEXT listener on the container's own loopback (9095) that only
#: the broker's own tools reach (it creates the SCRAM user there).
#: The JAAS config of both SCRAM listeners.
_JAAS = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
_SERVER = """\
# streamtrain: a single-node KRaft broker that requires TLS and SCRAM-SHA-512 (generated).
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:9093
controller.listener.names=CONTROLLER
listeners=SASL_SSL://:9092,HOST://:9094,CONTROLLER://127.0.0.1:9093,LOCAL://127.0.0.1:9095
advertised.listeners=SASL_SSL://kafka:9092,HOST://localhost:9094,LOCAL://127.0.0.1:9095
listener.security.protocol.map=SASL_SSL:SASL_SSL,HOST:SASL_SSL,CONTROLLER:PLAINTEXT,LOCAL:PLAINTEXT
inter.broker.listener.name=LOCAL
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={jaas}
listener.name.host.scram-sha-512.sasl.jaas.config={jaas}
ssl.keystore.type=PEM
ssl.keystore.location={folder}/broker.pem
log.dirs=/var/lib/kafka/data
num.partitions=2
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.hours=24
log.retention.bytes=10737418240
"""


def _private(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to a new file created with ``mode`` (never wider, even for a moment)."""
    tmp = path.with_name(f".{path.name}.new")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _certificates(days: int) -> tuple[bytes, bytes]:
    """A new CA's certificate, and the broker's key and certificate (one PEM file) signed by it."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"streamtrain kafka CA {uuid.uuid4().hex[:8]}")]
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in BROKER_NAMES]
    names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    broker = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, BROKER_NAMES[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    # PKCS#8, unencrypted: what Kafka's PEM keystore reads without ssl.key.password.
    key_pem = key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ca.public_bytes(pem), key_pem + broker.public_bytes(pem)


def write(
    broker_dir: str | Path,
    client_file: str | Path,
    *,
    ca_file: str | Path | None = None,
    days: int = 825,
) -> bool:
    """Write the broker's files into ``broker_dir`` and the client's into ``client_file``
    (and the CA's certificate beside it, or at ``ca_file``), unless they are there already;
    whether they were written.

    ``broker_dir`` gets ``server.properties``, ``broker.pem`` (key and certificate),
    ``ca.pem``, ``scram-user.properties`` (``kafka-configs --add-config-file`` reads it) and
    ``cluster-id``, mode 0644 (the broker runs as another user: keep that volume its own).
    ``client_file`` (mode 0600) is a client properties file for ``--kafka-conf``.
    """
    broker_dir, client_file = Path(broker_dir), Path(client_file)
    ca_file = Path(ca_file) if ca_file else client_file.with_name("kafka-ca.pem")
    if (broker_dir / "server.properties").is_file() and client_file.is_file():
        return False
    for folder in (broker_dir, client_file.parent, ca_file.parent):
        if not folder.is_dir():
            raise ConfigError(
                f"Expected a folder for the Kafka credentials. Received: {folder}, which does not "
                "exist."
            )
    password = secrets.token_urlsafe(32)
    ca, broker = _certificates(days)
    _private(broker_dir / "broker.pem", broker, 0o644)
    _private(broker_dir / "ca.pem", ca, 0o644)
    _private(
        broker_dir / "scram-user.properties",
        # kafka-configs' file form: no brackets (on its command line, `[...]` groups a list;
        # in the file the value is taken whole, and `[password=…]` is refused, the password
        # printed in the broker's log by Kafka 4.4's ConfigCommand).
        f"SCRAM-SHA-512=password={password}\n".encode(),
        0o644,
    )
    # Kafka's cluster ids are a UUID's 16 bytes in URL-safe base64, unpadded (22 characters).
    _private(
        broker_dir / "cluster-id",
        base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=") + b"\n",
        0o644,
    )
    _private(ca_file, ca, 0o644)
    _private(
        client_file,
        (
            f"# streamtrain: the stack's Kafka (generated). Keep this file secret.\n"
            f"security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username={USER}\n"
            f"sasl.password={password}\nssl.ca.location={ca_file}\n"
        ).encode(),
        0o600,
    )
    # Last: its presence says the rest is written (a start killed half-way writes all again).
    _private(
        broker_dir / "server.properties",
        _SERVER.format(folder=broker_dir, jaas=_JAAS).encode(),
        0o644,
    )
    return True
