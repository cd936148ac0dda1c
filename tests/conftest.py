"""Real services for the tests: one embedded Kafka broker per session, a fresh topic per test."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipeline import config
from pipeline.kafka import EmbeddedBroker, client

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log) as b:
        yield b


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    return f"t-{request.node.name[:40].replace('[', '-').replace(']', '')}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real data folder (the shared HIGGS sample); its absence is an error, not a skip."""
    folder = config.data_dir()
    assert (folder / "higgs").is_dir(), f"no HIGGS sample under {folder}; set STREAMTRAIN_DATA_DIR"
    return folder


@pytest.fixture(scope="session")
def mnist():  # type: ignore[no-untyped-def]
    """Real MNIST (fetched once into the cache if needed)."""
    from producers import datasets

    return datasets.get("mnist")


@pytest.fixture
def consume(broker: EmbeddedBroker) -> Callable[..., list]:  # type: ignore[type-arg]
    """consume(topic, n) -> the first n records of every partition, in partition/offset order."""

    def _consume(topic: str, n: int, *, bootstrap: str | None = None, timeout_s: float = 30.0) -> list:  # type: ignore[type-arg]
        from kafka import TopicPartition

        c = client.consumer(bootstrap or broker.bootstrap, max_partition_fetch_bytes=8 << 20)
        try:
            tps = [TopicPartition(topic, p) for p in client.partitions_for(c, topic)]
            c.assign(tps)
            c.seek_to_beginning(*tps)
            records: list = []  # type: ignore[type-arg]
            deadline = time.monotonic() + timeout_s
            while len(records) < n and time.monotonic() < deadline:
                for batch in c.poll(timeout_ms=200, max_records=100_000).values():
                    records.extend(batch)
            return sorted(records, key=lambda r: (r.partition, r.offset))
        finally:
            c.close()

    return _consume


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """A real local Spark (2 cores), once per session."""
    from pipeline import spark as spark_mod

    s = spark_mod.session("local[2]", app="streamtrain-tests")
    yield s
    s.stop()
