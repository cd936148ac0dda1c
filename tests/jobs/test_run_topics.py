"""`streamtrain run` on topics as Kafka users have them: one it cannot read, bad options
about how to read one, and runs sharing one Kafka. (Codecs and transactions:
tests/ingest/test_client_compat.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ingest.test_fetch import _unreadable_topic

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
    )


@pytest.mark.slow
def test_a_topic_that_cannot_be_read_is_an_error_not_an_outage(raw_broker, topic, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One line naming topic, partition, offset and cause, exit status 2, no checkpoint:
    not 'Kafka unavailable', and not a clean stop with nothing trained."""
    broker = raw_broker  # Apache Kafka refuses a corrupt batch (tests/ingest/test_fetch.py)
    _unreadable_topic(broker.bootstrap, topic)
    done = _cli(
        "run",
        "--dataset",
        "higgs",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
        "--out",
        str(tmp_path / "run"),
        "--timeout",
        "120",
        "--eval-every",
        "100",
    )
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"streamtrain: error: Cannot read {topic}-0 at offset 3: Cannot inflate a zstd batch: "
        "corrupt data"
    ), done.stderr[-3000:]
    assert "unavailable" not in done.stderr
    assert not (tmp_path / "run" / "report.json").exists()


def test_a_bad_isolation_level_is_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    done = _cli("run", "--isolation-level", "read_some", "--out", str(tmp_path / "run"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "streamtrain: error: Expected --isolation-level read_committed or read_uncommitted. "
        "Received: 'read_some'"
    ]


@pytest.mark.slow  # two short runs
def test_two_runs_on_one_kafka_each_train_their_own_records(broker, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Proves: runs one after the other on one Kafka, each replaying HIGGS itself, each
    train their own 7,000 records once, in a topic of their own named in the report, and
    stop by themselves ("all produced records trained"); a resume keeps its run's topic.

    Slow: three starts of `streamtrain run` (Spark, the parameter server, TensorFlow workers):
    two whole runs, each replaying the 7,000 HIGGS records and training them to the end, and the
    second's resume, bounded by its 15 s --timeout; two runs are the least that share one Kafka."""
    from pipeline.train import checkpoint

    reports = []
    for name in ("first", "second"):
        done = _cli(
            "run",
            "--dataset",
            "higgs",
            "--bootstrap",
            broker.bootstrap,
            "--max-offsets-per-trigger",
            "2000",
            "--eval-every",
            "100",
            "--out",
            str(tmp_path / name),
            "--timeout",
            "200",
        )
        assert done.returncode == 0, done.stderr[-3000:]
        reports.append(json.loads((tmp_path / name / "report.json").read_text()))
    first, second = reports
    assert first["topic"] != second["topic"] and all(
        r["topic"].startswith("streamtrain-higgs-") for r in reports
    )
    for r in reports:
        assert (
            r["trained_records"] == 7_000 and r["stopped_because"] == "all produced records trained"
        ), r
    again = _cli("run", "--resume", str(tmp_path / "second"), "--timeout", "15")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "second" / "report.json").read_text())["topic"] == second["topic"]
    assert checkpoint.load(tmp_path / "second").extra["trained"] == 7_000  # type: ignore[union-attr]
