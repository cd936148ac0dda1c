"""`streamtrain run` on topics as Kafka users have them: one it cannot read, and bad options
about how to read one. (Codecs and transactions: tests/ingest/test_client_compat.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.ingest.test_fetch import _unreadable_topic

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], capture_output=True, text=True, timeout=400,
                          cwd=ROOT)


@pytest.mark.slow
def test_a_topic_that_cannot_be_read_is_an_error_not_an_outage(broker, topic, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One line naming topic, partition, offset and cause, exit status 2, no checkpoint:
    not 'Kafka unavailable', and not a clean stop with nothing trained."""
    _unreadable_topic(broker.bootstrap, topic)
    done = _cli("run", "--dataset", "higgs", "--bootstrap", broker.bootstrap, "--topic", topic,
                "--out", str(tmp_path / "run"), "--timeout", "120", "--eval-every", "100")
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"streamtrain: error: Cannot read {topic}-0 at offset 3: Cannot inflate a zstd batch: corrupt data"), (
        done.stderr[-3000:])
    assert "unavailable" not in done.stderr
    assert not (tmp_path / "run" / "report.json").exists()


def test_a_bad_isolation_level_is_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    done = _cli("run", "--isolation-level", "read_some", "--out", str(tmp_path / "run"))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "streamtrain: error: Expected --isolation-level read_committed or read_uncommitted. Received: 'read_some'"]
