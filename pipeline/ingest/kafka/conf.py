"""A Kafka client configuration, read once from the file users already keep.

Teams keep their Kafka client settings in a properties file (``key=value`` lines, the
names librdkafka and the Java client share): ``security.protocol``, ``sasl.mechanism``,
``sasl.username``, ``sasl.password``, ``ssl.ca.location`` and so on. ``--kafka-conf FILE``
(or ``STREAMTRAIN_KAFKA_CONF``) names that file; :func:`load` reads and checks it into a
:class:`~pipeline.ingest.kafka.security.KafkaConf`, which turns it into each kind of
client's arguments (:mod:`pipeline.ingest.kafka.security`).

Only the file's *path* ever travels (in a Spark plan, a task's closure, ``run.json``):
each process reads the file itself, so a password is never on a command line, in a plan
or in a record, and one rotated in the file is used by the next start. Executors on a
cluster read the same path on their own host.
"""

from __future__ import annotations

import functools
import os
import re
import ssl
import stat
from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.ingest.kafka.security import PLAINTEXT, KafkaConf

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

#: The security settings read from the file, by their Kafka property name.
_KEYS = {
    "security.protocol",
    "sasl.mechanism",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
}
#: Other names users' files carry for the same settings (librdkafka's plural, the Java client's).
_ALIASES = {"sasl.mechanisms": "sasl.mechanism", "ssl.truststore.location": "ssl.ca.location"}
#: Settings of other concerns that a team's client file often holds: read (bootstrap) or left alone.
_OTHER = (
    "bootstrap.servers",
    "client.id",
    "session.timeout.ms",
    "acks",
    "group.id",
    "request.timeout.ms",
    "client.dns.lookup",
    "auto.offset.reset",
    "enable.auto.commit",
)
_JAAS = re.compile(r"""(username|password)\s*=\s*(?:"([^"]*)"|'([^']*)')""")


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    r"""A Java properties value's backslash escapes resolved.

    >>> _unescape(r"127.0.0.1\:9093"), _unescape(r"a\=b\\c\u0041")
    ('127.0.0.1:9093', 'a=b\\cA')
    """
    return re.sub(
        r"\\(u[0-9a-fA-F]{4}|.)",
        lambda m: chr(int(m[1][1:], 16)) if len(m[1]) == 5 else _ESCAPES.get(m[1], m[1]),
        text,
    )


def read_properties(path: str | Path) -> dict[str, str]:
    r"""A Kafka client properties file, as Java's ``Properties`` reads it: ``key=value``,
    ``key: value`` or ``key value`` per line, ``#`` and ``!`` comments, a trailing backslash
    continuing a line, backslash escapes (``\:`` is ``:``).

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("w", suffix=".properties", delete=False) as f:
    ...     _ = f.write("# ours\nsecurity.protocol=SASL_SSL\nsasl.mechanism : SCRAM-SHA-512\n"
    ...                 "bootstrap.servers=a\\:1,\\\n    b\\:2\n")
    >>> read_properties(f.name)  # doctest: +NORMALIZE_WHITESPACE
    {'security.protocol': 'SASL_SSL', 'sasl.mechanism': 'SCRAM-SHA-512',
     'bootstrap.servers': 'a:1,b:2'}
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(
            f"Expected a readable Kafka client properties file for --kafka-conf. Received: {path} "
            f"({e.strerror})."
        ) from None
    props: dict[str, str] = {}
    logical: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.lstrip() if pending is not None else raw.strip()
        if pending is None and (not line or line.startswith(("#", "!"))):
            continue
        joined = (pending[1] if pending else "") + line
        trailing = len(joined) - len(joined.rstrip("\\"))
        if trailing % 2:  # an odd number of backslashes at the end: the line goes on
            pending = (pending[0] if pending else n, joined[:-1])
            continue
        logical.append((pending[0] if pending else n, joined))
        pending = None
    if pending is not None:
        logical.append(pending)
    for n, line in logical:
        m = re.match(r"((?:\\.|[^=:\s\\])+)\s*(?:[=:]\s*|\s+)(.*)$", line, re.S)
        if m is None:
            # The line may hold a secret: name its number, never its text.
            raise ConfigError(
                f"Expected 'key=value' on line {n} of {path}. Received a line without '=' there."
            )
        props[_unescape(m[1])] = _unescape(m[2].rstrip())
    return props


def _owner_only(path: str, what: str) -> None:
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"Expected {path} readable by its owner only: it holds {what}. "
            f"Received: mode {mode:o}. Run: chmod 600 {path}"
        )


def _readable(path: str, key: str, source: Path) -> str:
    if not os.access(path, os.R_OK) or not os.path.isfile(path):
        raise ConfigError(
            f"Expected {key} in {source} to name a readable file. Received: {path}. Fix the path, "
            "or give this process read access to it."
        )
    return path


def _jaas(props: dict[str, str]) -> None:
    """The Java client's ``sasl.jaas.config`` (``... username="u" password="p";``) read into
    ``sasl.username``/``sasl.password``: the line Java users already have."""
    jaas = props.pop("sasl.jaas.config", None)
    if jaas is None:
        return
    for name, double, single in _JAAS.findall(jaas):
        props.setdefault(f"sasl.{name}", double or single)


def _check_ca(path: str, source: Path) -> None:
    """CA certificates that do not load fail here, naming the setting, not in a handshake."""
    try:
        ssl.create_default_context().load_verify_locations(cafile=path)
    except (ssl.SSLError, OSError) as e:
        raise ConfigError(
            f"Expected ssl.ca.location in {source} to hold PEM certificates. Received: {path} "
            f"({e})."
        ) from None


def parse(props: dict[str, str], source: str | Path = "the Kafka client properties") -> KafkaConf:
    """Check the properties of a client file and build a :class:`KafkaConf` from them.

    >>> parse({"security.protocol": "SASL_SSL", "sasl.mechanisms": "PLAIN", "sasl.username": "key",
    ...        "sasl.password": "secret"}).describe()
    'SASL_SSL, PLAIN as key'
    >>> parse({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"})
    ... # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: Expected sasl.mechanism PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
    in the Kafka client properties. Received: 'GSSAPI'. streamtrain's clients speak these
    three; ask the Kafka team for a SCRAM user.
    """
    source = Path(source)
    props = dict(props)
    jaas = "sasl.jaas.config" in props
    _jaas(props)
    for alias, name in _ALIASES.items():
        if alias in props:
            props.setdefault(name, props.pop(alias))
    unknown = sorted(k for k in props if k not in _KEYS and k not in _OTHER)
    if unknown:
        raise ConfigError(
            f"Expected Kafka client security properties in {source} ({', '.join(sorted(_KEYS))}). "
            f"Received: {', '.join(unknown)}. Remove the line(s), or fix the name."
        )
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in PROTOCOLS:
        raise ConfigError(
            f"Expected security.protocol {', '.join(PROTOCOLS[:-1])} or {PROTOCOLS[-1]} "
            f"in {source}. Received: {props['security.protocol']!r}."
        )
    sasl, tls = protocol.startswith("SASL_"), protocol.endswith("SSL")
    mechanism = props.get("sasl.mechanism", "").upper() or None
    if sasl:
        if mechanism not in MECHANISMS:
            raise ConfigError(
                f"Expected sasl.mechanism PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 in {source}. "
                f"Received: {props.get('sasl.mechanism')!r}. "
                "streamtrain's clients speak these three; ask the Kafka team for a SCRAM user."
            )
        missing = [k for k in ("sasl.username", "sasl.password") if not props.get(k)]
        if missing:
            raise ConfigError(
                f"Expected {' and '.join(missing)} in {source} for security.protocol {protocol}. "
                "Received: none. Add the user's name and password to the file."
            )
    elif mechanism or props.get("sasl.username") or props.get("sasl.password"):
        raise ConfigError(
            f"Expected security.protocol SASL_SSL or SASL_PLAINTEXT in {source} beside sasl.* "
            f"settings. Received: {protocol}. Without it the user and password would be unused."
        )
    files = {
        k: props[k]
        for k in ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location")
        if props.get(k)
    }
    if files and not tls:
        raise ConfigError(
            f"Expected security.protocol SSL or SASL_SSL in {source} beside {', '.join(files)}. "
            f"Received: {protocol}: the connection would not use TLS at all."
        )
    for name, path in files.items():
        _readable(path, name, source)
    if "ssl.ca.location" in files:
        _check_ca(files["ssl.ca.location"], source)
    cert, key = files.get("ssl.certificate.location"), files.get("ssl.key.location")
    if bool(cert) != bool(key) and not (cert and not key and _holds_key(cert)):
        raise ConfigError(
            f"Expected ssl.certificate.location and ssl.key.location together in {source} "
            "(a client certificate and its private key). "
            f"Received: only {'the certificate' if cert else 'the key'}."
        )
    if key or cert:  # a key of its own, or one inside the certificate's file
        _owner_only(key or cert or "", "a private key")
    algorithm = props.get("ssl.endpoint.identification.algorithm", "https").strip().lower()
    if algorithm not in ("https", "", "none"):
        raise ConfigError(
            "Expected ssl.endpoint.identification.algorithm https (the default) or empty "
            f"in {source}. Received: {algorithm!r}."
        )
    conf = KafkaConf(
        path=str(source),
        protocol=protocol,
        mechanism=mechanism if sasl else None,
        username=props.get("sasl.username") if sasl else None,
        password=props.get("sasl.password") if sasl else None,
        ca=files.get("ssl.ca.location"),
        certificate=cert,
        key=key or (cert if cert else None),
        key_password=props.get("ssl.key.password") or None,
        verify_hostname=algorithm == "https",
        bootstrap=props.get("bootstrap.servers") or None,
        jaas=jaas and sasl,
    )
    if tls:
        try:
            conf.ssl_context()
        except (ssl.SSLError, OSError) as e:
            raise ConfigError(
                f"Cannot use the client certificate {cert} with its key {key} from {source} ({e}). "
                "Check that they belong together and ssl.key.password is right."
            ) from None
    return conf


def _holds_key(path: str) -> bool:
    try:
        return "PRIVATE KEY-----" in Path(path).read_text(errors="replace")
    except OSError:
        return False


def load(path: str | Path | None) -> KafkaConf:
    """The settings of the file at ``path`` (PLAINTEXT for None), checked: a file holding
    a password must be readable by its owner alone, as the Spark properties file must.

    A process asks for the same file many times (each task of an executor): it is read
    again only when it changed, so a rotated password is used from the next client on.

    Raises:
        ConfigError: one line naming the file, what it expected, what it found, what to do.
    """
    if path is None or str(path) == "":
        return PLAINTEXT
    path = Path(path).expanduser().absolute()
    try:
        st = path.stat()
    except OSError as e:
        raise ConfigError(
            f"Expected a readable Kafka client properties file for --kafka-conf. Received: {path} "
            f"({e.strerror})."
        ) from None
    return _load(str(path), st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


@functools.lru_cache(maxsize=8)
def _load(path: str, *_version: int) -> KafkaConf:
    props = read_properties(path)
    if any(props.get(k) for k in ("sasl.password", "ssl.key.password", "sasl.jaas.config")):
        _owner_only(path, "a password")
    return parse(props, path)
