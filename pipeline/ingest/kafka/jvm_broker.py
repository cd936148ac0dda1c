"""Apache Kafka's own broker, in KRaft mode, as the ``kafka`` engine of the embedded broker.

One JVM is broker and controller at once (``process.roles=broker,controller``), as the
compose file's ``apache/kafka`` runs. Its jars (``org.apache.kafka:kafka_2.13`` and what it
needs) come from Maven once (:mod:`pipeline.cluster.maven`) or from ``$STREAMTRAIN_KAFKA_HOME``
(an unpacked distribution's ``libs/``). Before its first start a data folder is formatted by
Kafka's own ``StorageTool``, which is also where SCRAM users are made (``--add-scram``), as
``kafka-storage.sh format`` makes them.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.cluster import jvmcache, maven
from pipeline.errors import BrokerError, ConfigError

#: What the broker's log says, at what level: Kafka's INFO is a few lines a second at rest.
_LOG4J2 = """\
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
logger.requests.name = kafka.request.logger
logger.requests.level = WARN
logger.changes.name = state.change.logger
logger.changes.level = WARN
"""


def coordinates(version: str) -> list[str]:
    """The Maven coordinates of Kafka's broker (and a binding that gives it a log).

    Example:
        >>> coordinates("4.4.0")[0]
        'org.apache.kafka:kafka_2.13:4.4.0'
    """
    return [
        f"org.apache.kafka:kafka_2.13:{version}",
        # Kafka logs through SLF4J 1.7; without a binding its log is empty. Kafka's own
        # distribution ships this one, with log4j2.
        "org.apache.logging.log4j:log4j-slf4j-impl:2.25.5",
    ]


def classpath(
    *, version: str, home: Path | None = None, repo: str | None = None, quiet: bool = True
) -> str:
    """The broker's classpath: ``home/libs/*`` (an unpacked distribution), else the jars of
    ``version`` resolved into the cache from ``repo``."""
    if home is not None:
        libs = Path(home) / "libs"
        if not any(libs.glob("kafka_2.13-*.jar")):
            raise ConfigError(
                f"Expected an unpacked Apache Kafka distribution in STREAMTRAIN_KAFKA_HOME. "
                f"Received: {home}, with no libs/kafka_2.13-*.jar. Point it at the folder "
                "kafka_2.13-<version>.tgz unpacks to, or unset it to resolve the jars from Maven."
            )
        return str(libs / "*")
    jars = maven.resolve(
        "kafka", coordinates(version), what="Apache Kafka's broker", repo=repo, quiet=quiet
    )
    return os.pathsep.join(str(j) for j in jars)


def java() -> str:
    found = jvmcache.java_binary()
    if found is None:
        raise BrokerError(
            "The kafka engine runs Apache Kafka's broker, which needs Java 17 or newer: no "
            "`java` on PATH and no JAVA_HOME. Install a JDK, or use --engine tansu."
        )
    return found


def properties(
    *,
    host: str,
    port: int,
    controller_port: int,
    log_dir: Path,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """A single-node KRaft broker's properties: a PLAINTEXT listener on ``host:port``.

    ``overrides`` adds listeners (append them to ``listeners`` yourself) or changes any
    setting; every topic Kafka keeps for itself has one replica, as one broker allows.

    Example:
        >>> p = properties(host="127.0.0.1", port=9092, controller_port=9093, log_dir=Path("/d"))
        >>> p["listeners"]
        'PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093'
    """
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": (
            "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,"
            "SASL_SSL:SASL_SSL"
        ),
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        # Fifty partitions is the default, made at the first group's first commit: one is
        # enough on one broker, and costs a fiftieth of the start-up work.
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Tests and the embedded run make topics by writing to them, as Tansu lets them.
        "auto.create.topics.enable": "true",
    }
    props.update(overrides or {})
    return props


def write_properties(path: Path, props: Mapping[str, str]) -> None:
    """Write ``props`` as a Java properties file (values escaped as Java reads them)."""

    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n")

    path.write_text("".join(f"{k}={escape(v)}\n" for k, v in props.items()))
    path.chmod(0o600)  # may hold JAAS passwords and key store passwords


def read_properties(path: Path) -> dict[str, str]:
    """The ``key=value`` lines of a properties file this module wrote."""
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def cluster_id() -> str:
    """A new cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's Uuid).

    Like Kafka's ``Uuid.randomUuid``, never one that starts with ``-``: a command line would
    read it as an option.

    Example:
        >>> len(cluster_id()), cluster_id()[0] != "-"
        (22, True)
    """
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not found.startswith("-"):
            return found


def format_storage(
    cp: str,
    config_path: Path,
    *,
    scram: Sequence[str] = (),
    log_path: Path | None = None,
    timeout_s: float = 120.0,
) -> None:
    """Format the data folder named in ``config_path`` (once: a formatted one is kept).

    ``scram`` are ``--add-scram`` values, e.g. ``SCRAM-SHA-256=[name=alice,password=secret]``:
    the users a SCRAM listener admits, stored in the cluster's metadata before it starts.
    """
    cmd = [java(), "-Xmx256m", "-cp", cp, "kafka.tools.StorageTool", "format"]
    cmd += ["-t", cluster_id(), "-c", str(config_path), "--ignore-formatted"]
    for entry in scram:
        cmd += ["--add-scram", entry]
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s)
    if log_path is not None:
        with open(log_path, "ab") as log:
            log.write(done.stdout + done.stderr)
    if done.returncode != 0:
        # Passwords in --add-scram never reach the message: only the tool's last line.
        lines = (done.stderr or done.stdout).decode(errors="replace").strip().splitlines()
        raise BrokerError(
            f"Kafka's storage format failed ({lines[-1] if lines else 'no output'}); "
            f"check {config_path}."
        )


def formatted_template(cp: str, folder: Path) -> Path:
    """A data folder formatted once (no SCRAM users) under ``folder``, copied into each new
    broker's: a start then runs one JVM, not two (the format's costs ~1-2 s on 2 cores).

    Its node id is 1 and its cluster id fixed, as every single-node broker here has; the
    controller's address is not in it (the voters are static, in each broker's properties).
    """
    data = folder / "data"
    if (data / "meta.properties").is_file():
        return data
    folder.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".format-", dir=folder))
    try:
        props = properties(host="127.0.0.1", port=1, controller_port=2, log_dir=work / "data")
        write_properties(work / "server.properties", props)
        format_storage(cp, work / "server.properties")
        try:
            (work / "data").rename(data)  # atomic: a second broker formatting too loses here
        except OSError:
            if not (data / "meta.properties").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return data


def kept_controller_port(previous: Path) -> int | None:
    """The controller's port in a kept data folder's last properties, if any."""
    try:
        return int(read_properties(previous)["controller.quorum.voters"].rsplit(":", 1)[1])
    except (OSError, KeyError, ValueError, IndexError):
        return None


def prepare(
    folder: Path,
    props: Mapping[str, str],
    *,
    cp: str,
    scram: Sequence[str] = (),
    template: Path | None = None,
    log_path: Path | None = None,
    heap: str = "512m",
) -> list[str]:
    """Write ``props`` into ``folder``, format their data folder if it is new, and return
    the broker's command line. ``template``: where a data folder formatted once (no SCRAM
    users) is kept, copied rather than formatted again."""
    config_path = folder / "server.properties"
    write_properties(config_path, props)
    data = Path(props["log.dirs"].split(",")[0])
    if (data / "meta.properties").is_file():
        pass  # a kept data folder, formatted at its first start
    elif template is not None and not data.exists():
        shutil.copytree(formatted_template(cp, template), data)
    else:
        format_storage(cp, config_path, scram=scram, log_path=log_path)
    write_log_config(folder / "log4j2.properties")
    return command(cp, config_path, folder / "log4j2.properties", heap=heap)


def command(cp: str, config_path: Path, log4j_path: Path, *, heap: str = "512m") -> list[str]:
    """The broker's command line: Kafka's own JVM settings with the heap capped at ``heap``."""
    return [
        java(),
        f"-Xmx{heap}",
        "-Xms128m",  # grown as needed: an idle test broker keeps little
        # kafka-run-class.sh's own choices (low pauses, no GUI), and a JVM that gives back
        # the heap it does not use.
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:InitiatingHeapOccupancyPercent=35",
        "-XX:+ExplicitGCInvokesConcurrent",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j_path}",
        "-cp",
        cp,
        "kafka.Kafka",
        str(config_path),
    ]


def write_log_config(path: Path) -> None:
    path.write_text(_LOG4J2)
