"""Spark settings from a properties file, and what a cluster needs of them to be safe.

On a Spark standalone cluster the driver ships each task, with the parameter server's
secret inside it, over Spark's RPC; executors fetch the broadcasts and the results come
back the same way. Off one machine that traffic must be authenticated and encrypted:
``spark.authenticate`` with a shared secret (standalone mode reads it from the
configuration only, not from a file) and ``spark.network.crypto.enabled``. The master,
the workers and the driver read one properties file for it (the master and workers with
``--properties-file``, ``streamtrain run`` with ``--spark-conf``), never the command line.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from pipeline.errors import ConfigError

#: Host names and addresses of this machine's loopback.
LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")
#: What a cluster beyond loopback must set, and the value.
REQUIRED = {"spark.authenticate": "true", "spark.network.crypto.enabled": "true"}
#: The ports the workers connect to on the driver, fixed for a firewall (Spark's default is a
#: new random port every run); an executor's block manager takes the next free one above.
FIXED_PORTS = {"spark.driver.port": "7078", "spark.blockManager.port": "7079"}


def read_properties(path: str | Path) -> dict[str, str]:
    """A Spark properties file (``spark-defaults.conf``'s format: ``key value`` or
    ``key=value`` per line, ``#`` comments) as a dict.

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("w", suffix=".conf", delete=False) as f:
    ...     _ = f.write("# comment\\nspark.authenticate true\\nspark.task.maxFailures=4\\n")
    >>> read_properties(f.name)
    {'spark.authenticate': 'true', 'spark.task.maxFailures': '4'}
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(
            f"Expected a readable Spark properties file for --spark-conf. Received: {path} "
            f"({e.strerror})"
        ) from None
    props = {}
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = _split(line)
        if not sep or not key.startswith("spark."):
            raise ConfigError(
                f"Expected 'spark.KEY VALUE' on line {n} of {path}. Received: {line[:60]!r}"
            )
        props[key] = value
    return props


def _split(line: str) -> tuple[str, str, str]:
    """A line's key, separator and value (the first '=' or run of spaces separates)."""
    for i, ch in enumerate(line):
        if ch == "=" or ch.isspace():
            return line[:i].strip(), ch, line[i + 1 :].strip().lstrip("=").strip()
    return line, "", ""


def master_host(master: str) -> str | None:
    """The host of a ``spark://HOST:PORT`` master (the first, for a list); None for others.

    >>> master_host("spark://10.0.0.1:7077"), master_host("local[2]")
    ('10.0.0.1', None)
    """
    if not master.startswith("spark://"):
        return None
    return master[len("spark://") :].split(",")[0].rsplit(":", 1)[0]


def on_loopback(master: str) -> bool:
    """Whether every process of ``master`` runs on this machine's loopback.

    >>> on_loopback("local[*]"), on_loopback("spark://127.0.0.1:7077"), on_loopback("spark://10.0.0.1:7077")
    (True, True, False)
    """
    return master.startswith("local") or master_host(master) in LOOPBACK


def spark_conf(master: str, path: str | None, *, option: str = "--spark-conf") -> dict[str, str]:
    """The settings of ``--spark-conf`` for ``master``, checked: a cluster beyond loopback
    needs authentication, a secret and encryption, from a file only its owner can read.

    Args:
        option: the option that names the file, for the message (``--properties-file`` for
            the master and the workers).
    """
    props = read_properties(path) if path else {}
    host = master_host(master)
    if host is None or (host in LOOPBACK and not props):
        return props
    missing = [f"{k} {v}" for k, v in REQUIRED.items() if props.get(k, "").lower() != v]
    if not props.get("spark.authenticate.secret"):
        missing.append("spark.authenticate.secret <random>")
    if missing:
        raise ConfigError(
            f"Expected {option} FILE with {', '.join(missing)} for the cluster at {master} (the "
            f"tasks carry the parameter server's secret). Received: {path or 'no file'}. Write "
            "one with: streamtrain cluster-conf FILE; start the master and workers with "
            "--properties-file FILE, and train with --spark-conf FILE."
        )
    assert path is not None
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"Expected {path} readable by its owner only: it holds the cluster's secret. "
            f"Received: mode {mode:o}. Run: chmod 600 {path}"
        )
    return props


def write_conf(path: str | Path) -> Path:
    """Write a new properties file with a fresh secret (mode 0600; an existing file is kept)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(
            f"{path} exists; pass a new file name (or remove it to make a new secret)."
        ) from None
    except OSError as e:
        raise ConfigError(f"Cannot write {path} ({e.strerror}).") from None
    lines = [f"{k} {v}" for k, v in REQUIRED.items()] + [
        f"spark.authenticate.secret {secrets.token_hex(32)}"
    ]
    with os.fdopen(fd, "w") as f:
        f.write("# streamtrain: Spark RPC authentication and encryption. Keep this file secret.\n")
        f.write("\n".join(lines) + "\n")
        f.write(
            "# The driver's ports the workers connect to (open them from the workers to the "
            "driver).\n"
        )
        f.write("".join(f"{k} {v}\n" for k, v in FIXED_PORTS.items()))
        f.write(
            "# Your own Spark settings go below, one 'spark.KEY VALUE' a line (e.g. "
            "spark.executor.memory 6g).\n"
        )
    return path


def write_secret(path: str | Path, *, mode: int = 0o600) -> bool:
    """Write a fresh random token (32 bytes, hex) to ``path`` with ``mode``, unless a non-empty
    file is there already (a deployment's later starts keep theirs); whether one was written."""
    path = Path(path)
    if path.is_file() and path.stat().st_size:
        return False
    tmp = path.with_name(f".{path.name}.new")
    tmp.unlink(missing_ok=True)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except OSError as e:
        raise ConfigError(f"Cannot write {path} ({e.strerror}).") from None
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    os.chmod(tmp, mode)  # whatever the umask
    tmp.replace(path)
    return True
