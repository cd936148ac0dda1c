"""The compose file's Kafka, run: the settings docker-compose.yml and deploy/kafka-secured.yml
give ``apache/kafka`` are started as Apache Kafka's own broker here (the image's version, from
the same jars), so that a wrong setting there fails a test here, not a user's first
``docker compose up``.

What the image adds to the variables is deploy/standins/kafka/image_env.py (apache/kafka's
``configureDefaults`` and its variable to property rule, the Kafka stand-in image's own
start-up); host names and ports are moved onto loopback and free ports, nothing else. The
images themselves run in tests/deploy/test_containers.py, where Podman can run them.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline import config
from pipeline.ingest.kafka import EmbeddedBroker, client, conf, free_port
from pipeline.ingest.kafka.security import KafkaConf
from tests.conftest import ROOT
from tests.test_deploy import _model


def _image_env() -> Any:
    """deploy/standins/kafka/image_env.py: what apache/kafka's start-up writes from the
    variables (its ``configureDefaults`` and its variable-to-property rule), which the
    Kafka stand-in image runs as its start-up too."""
    import importlib.util

    path = ROOT / "deploy" / "standins" / "kafka" / "image_env.py"
    spec = importlib.util.spec_from_file_location("image_env", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


image_properties = _image_env().image_properties


def _onto_loopback(props: dict[str, str], hosts: set[str]) -> tuple[dict[str, str], dict[int, int]]:
    """The same properties with every listener's host on 127.0.0.1 and every port a free
    one (a listener with no host, which binds every interface, binds loopback alone here)."""
    ports: dict[int, int] = {}

    def move(match: re.Match[str]) -> str:
        port = int(match.group(3))
        ports.setdefault(port, free_port())
        return f"{match.group(1)}127.0.0.1:{ports[port]}"

    address = re.compile(r"((?:^|,|//|@))(" + "|".join(map(re.escape, hosts)) + r"|)?:(\d+)")
    moved = dict(props)
    for key in ("listeners", "advertised.listeners", "controller.quorum.voters"):
        if key in moved:
            moved[key] = address.sub(move, moved[key])
    return moved, ports


@pytest.fixture(scope="module")
def compose_bin() -> str:
    import compose

    return str(Path(compose.__file__).parent / "docker-compose")


def _produce_and_read(bootstrap: str, settings: KafkaConf | None = None) -> None:
    """A record written and read back through ``bootstrap``, with librdkafka."""
    from confluent_kafka import Consumer, Producer

    extra = settings.librdkafka() if settings else {}
    topic = f"compose-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": bootstrap, **extra})
    producer.produce(topic, b"v")
    assert producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": topic,
            "auto.offset.reset": "earliest",
            **extra,
        }
    )
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                assert message.value() == b"v"
                return
        raise AssertionError(f"nothing read back from {topic} through {bootstrap}")
    finally:
        consumer.close()


def test_the_image_keeps_its_data_in_the_volume_the_compose_file_mounts(compose_bin: str) -> None:
    """apache/kafka writes to /tmp/kraft-combined-logs unless told: a volume elsewhere would
    keep nothing across a container's re-creation."""
    kafka = _model(compose_bin)["services"]["kafka"]
    props = image_properties(kafka["environment"])
    volumes = {v["target"] for v in kafka["volumes"] if v["type"] == "volume"}
    assert props["log.dirs"] in volumes, (props["log.dirs"], volumes)


@pytest.fixture(scope="module")
def compose_broker(
    compose_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[EmbeddedBroker, dict[int, int]]]:
    """The compose file's broker, from the properties its image would write."""
    kafka = _model(compose_bin)["services"]["kafka"]
    assert kafka["image"] == f"apache/kafka:{config.settings().kafka_version}", (
        "the compose file's Kafka is not the version the tests run"
    )
    props, ports = _onto_loopback(image_properties(kafka["environment"]), {"kafka", "localhost"})
    folder = tmp_path_factory.mktemp("compose-kafka")
    props["log.dirs"] = str(folder / "data")
    with EmbeddedBroker(
        engine="kafka",
        port=ports[9092],
        properties=props,
        kraft_defaults=False,
        log_path=folder / "broker.log",
    ) as broker:
        yield broker, ports


@pytest.mark.slow  # a broker JVM of its own: full tier only
def test_the_compose_files_kafka_serves_the_stack_and_the_host(
    compose_broker: tuple[EmbeddedBroker, dict[int, int]],
) -> None:
    """Proves: the settings start a broker; the stack's listener (kafka:9092) and the host's
    (localhost:9094) each take a write and give it back, transactions' topic included (one
    replica: a wrong replication factor leaves the coordinator unavailable)."""
    broker, ports = compose_broker
    for port in (9092, 9094):
        _produce_and_read(f"127.0.0.1:{ports[port]}")
    assert client.partitions_for(f"127.0.0.1:{ports[9094]}", "__consumer_offsets")


@pytest.mark.slow  # `streamtrain secrets` and a broker JVM of its own: full tier only
def test_the_secured_variants_broker_admits_its_generated_client(tmp_path: Path) -> None:
    """deploy/kafka-secured.yml's broker runs the server.properties that `streamtrain secrets
    --kafka-broker` writes, formatted with its cluster id, its user made through the loopback
    listener as the compose file makes it (AlterUserScramCredentials); the generated client
    file then logs in over TLS with SCRAM-SHA-512, and a wrong password is refused."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    broker_dir, client_file = tmp_path / "broker", tmp_path / "secrets" / "client.properties"
    broker_dir.mkdir()
    client_file.parent.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "secrets", "--kafka-broker", str(broker_dir)]
        + ["--kafka-client", str(client_file)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    text = (broker_dir / "server.properties").read_text()
    props = dict(
        line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    props, ports = _onto_loopback(props, {"kafka", "localhost", "127.0.0.1"})
    props["log.dirs"] = str(tmp_path / "data")
    secured = conf.load(client_file)
    password = re.fullmatch(
        r"SCRAM-SHA-512=password=(\S+)\n", (broker_dir / "scram-user.properties").read_text()
    )  # kafka-configs' file form, as tests/deploy/test_containers.py runs it
    assert password and password.group(1) == secured.password
    with EmbeddedBroker(
        engine="kafka",
        port=ports[9095],
        properties=props,
        kraft_defaults=False,
        log_path=tmp_path / "broker.log",
    ) as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        upsert = UserScramCredentialUpsertion(
            secured.username,
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
            password.group(1).encode(),
        )
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(30)
        host = f"localhost:{ports[9094]}"
        _produce_and_read(host, secured)
        wrong = tmp_path / "wrong.properties"
        wrong.write_text(client_file.read_text().replace(secured.password, "not-the-password"))
        wrong.chmod(0o600)
        with pytest.raises(Exception, match="refused user"):
            client.check_reachable(host, conf=conf.load(wrong), timeout_s=10)
