"""A test PKI for secured Kafka on loopback: a CA, the broker's certificates (a good one and
one for each way a certificate fails to verify) and client certificates, as PEM files.

Made with the ``cryptography`` package (a project dependency): its builder sets any validity
period, which the ``openssl`` CLI here cannot (an expired certificate needs a not-after in
the past). Keys are EC P-256 in PKCS#8, unencrypted: instant to generate, and read by OpenSSL
(librdkafka, Python's ssl) and by Apache Kafka's PEM key store alike.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

#: Which certificate a broker presents: the good one, or one that fails to verify in one way.
ServerCert = Literal["good", "other_ca", "wrong_name", "expired"]


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


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by its owner alone, from the first byte (no chmod window)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)  # O_CREAT's mode does not apply to a file already there
        f.write(data)


def make_pki(folder: str | os.PathLike[str]) -> Pki:
    """Create a test PKI in ``folder`` (see the module docstring for how and why so)."""
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
        write_private(
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
