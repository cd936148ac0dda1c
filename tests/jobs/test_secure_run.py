"""`streamtrain run`, `produce` and `predict` against secured Kafka (issue 38), end to end.

librdkafka writes HIGGS records, zstd-compressed in a transaction, into Apache Kafka's own
broker (tests/ingest/secure_kafka.py) requiring SASL_SSL with SCRAM-SHA-512; the run trains
every one exactly once through the Python source's Fetch reader, and again through Spark's
own Kafka source (its Java client reading the secrets through the ``kafka.``-prefixed
options' FileConfigProvider references), sets the malformed ones aside in the dead-letter
topic there, and the predict stream writes its predictions there. A second run, on a broker
that requires a client certificate, replays HIGGS itself and trains through the kafka-python
fallback. While they run, no process's command line or environment holds the password;
after, no file of the run does.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.ingest.kafka import client, conf
from pipeline.ingest.kafka.fetch import RangeReader
from pipeline.train.ledger import check_ledger
from tests import docblocks
from tests.cluster.proc_scan import Watch
from tests.conftest import SOURCES
from tests.ingest.secure_kafka import SecureKafka
from tests.ingest.test_secure_kafka import higgs_records, write_transaction

ROOT = Path(__file__).resolve().parents[2]
N = 3_000
MALFORMED = 12


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _count(kafka: SecureKafka, path: Path, topic: str) -> int:
    """Records in ``topic`` (every partition), read through the secured endpoint."""
    secured = conf.load(path)
    reader = RangeReader(kafka.bootstrap, conf=secured, timeout_s=20)
    try:
        return sum(
            len(rec)
            for p in client.partitions_for(kafka.bootstrap, topic, conf=secured)
            for rec in reader.read(topic, p, 0, reader.log_end(topic, p, at=0))
        )
    finally:
        reader.close()


def _holds(folder: Path, secret: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.fixture(scope="module")
def scram(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    with SecureKafka(
        tmp_path_factory.mktemp("scram"), mode="sasl_ssl", mechanisms=("SCRAM-SHA-512",)
    ) as kafka:
        yield kafka


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES)
def test_a_run_trains_a_librdkafka_transaction_from_sasl_ssl_exactly_once(
    scram: SecureKafka, source: str, tmp_path: Path
) -> None:
    """Proves: a librdkafka transaction on SASL_SSL (SCRAM-SHA-512) Kafka trains every record
    once through either source, its malformed records go to dead letters and `predict` writes
    its predictions there, and the password is in no process's command line or environment, nor
    in any file of the run.

    Slow: per source, a `streamtrain run` (Spark, the parameter server, a TensorFlow worker)
    over TLS and SASL that streams until its 25 s --timeout, then a `streamtrain predict` with a
    Spark session of its own; the module's secured broker (Apache Kafka's JVM, with its
    certificates and SCRAM users) starts once, with the first case."""
    path = scram.write_client_properties(tmp_path / "client.properties")
    topic = f"secured-higgs-{source}"  # one broker serves both runs
    client.ensure_topic(scram.bootstrap, topic, partitions=1, conf=conf.load(path))
    values, keys = higgs_records(N)
    bad = [b"not a HIGGS record %d" % i for i in range(MALFORMED)]
    write_transaction(
        scram,
        topic,
        values[: N // 2] + bad + values[N // 2 :],
        keys[: N // 2] + bad + keys[N // 2 :],
    )
    out = tmp_path / "run"
    with Watch(
        scram.password, interval_s=0.2
    ) as seen:  # every process's command line and environment
        done = _cli(
            "run",
            "--dataset",
            "higgs",
            "--bootstrap",
            scram.bootstrap,
            "--kafka-conf",
            str(path),
            "--topic",
            topic,
            "--workers",
            "1",
            "--source",
            source,
            "--max-offsets-per-trigger",
            "1000",
            "--eval-every",
            "100",
            "--timeout",
            "25",
            "--out",
            str(out),
        )
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["source"] == source
    assert report["trained_records"] == N and report["rejected_records"] == MALFORMED, report
    assert check_ledger(report["ledger"]) == {
        (topic, 0): N + MALFORMED + 1
    }  # and the commit marker
    assert (
        _count(scram, path, f"{topic}.dlq") == MALFORMED
    )  # set aside through the same TLS and SASL
    assert "SASL_SSL, SCRAM-SHA-512 as" in done.stderr + done.stdout, done.stdout
    # The predict stream reads and writes through it too.
    predicted = _cli(
        "predict",
        "--run",
        str(out),
        "--topic",
        topic,
        "--bootstrap",
        scram.bootstrap,
        "--kafka-conf",
        str(path),
        "--available-now",
        "--checkpoint",
        str(tmp_path / "predict"),
    )
    assert f"wrote {N:,} predictions" in predicted.stdout, predicted.stdout
    assert _count(scram, path, f"{topic}.predictions") == N
    assert not seen.found and seen.scans > 10, seen.found
    assert not _holds(out, scram.password)


def _guide_commands() -> list[str]:
    """The Kafka guide's secured-cluster commands, as its block holds them (tests/docblocks.py)."""
    return docblocks.commands(docblocks.run_block("docs/kafka.md", __file__))


@pytest.mark.slow
def test_the_guides_commands_train_through_mutual_tls_with_the_consumer_fallback(
    tmp_path: Path,
) -> None:
    """Proves: docs/kafka.md's secured-cluster commands, as written, with a mutual-TLS client file
    (its bootstrap.servers naming the broker): produce writes HIGGS there, and the run
    replays it into a topic of its own and trains every record, read by kafka-python's
    consumer through the same TLS."""
    commands = _guide_commands()
    assert [c.split()[:2] for c in commands] == [
        ["chmod", "600"],
        ["streamtrain", "produce"],
        ["streamtrain", "run"],
    ]
    with SecureKafka(tmp_path / "kafka", mode="mtls") as kafka:
        path = kafka.write_client_properties(tmp_path / "client.properties")
        path.chmod(0o644)  # as a user's new file is, until the guide's chmod
        env = {**os.environ, "STREAMTRAIN_KAFKA_READER": "consumer"}
        for command in commands:
            argv = shlex.split(command)
            if argv[0] == "streamtrain":
                argv = [sys.executable, "-m", "pipeline", *argv[1:]]
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env
            )
            assert done.returncode == 0, (command, done.stderr[-3000:])
        assert _count(kafka, path, "higgs") == 7_000
        report = json.loads((tmp_path / "runs" / "higgs" / "report.json").read_text())
        assert (
            report["trained_records"] == 7_000
            and report["stopped_because"] == "all produced records trained"
        )
        check_ledger(report["ledger"])
