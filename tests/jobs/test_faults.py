"""Faults beyond a driver kill, survived end to end: a broker restart mid-run, and a disk that
fills under the checkpoint. Real broker (Apache Kafka's, its data in a folder that outlives a
restart), real Spark, real TensorFlow; the test reads what happened from the run's own files."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.ingest.kafka import EmbeddedBroker
from pipeline.ingest.kafka.broker import free_port
from pipeline.train import checkpoint
from pipeline.train.ledger import check_ledger
from producers import Replay, datasets

ROOT = Path(__file__).resolve().parents[2]
HIGGS_TRAIN = 7000


class Cli:
    """``streamtrain ARGS`` in the background, its output collected as it comes (drained, so
    Spark's chatter never fills a pipe and stalls the run)."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline", *args],
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._drain, args=(pipe, into), daemon=True)
            for pipe, into in ((self.proc.stdout, self.lines), (self.proc.stderr, self.err))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _drain(pipe: Any, into: list[str]) -> None:
        for line in pipe:
            into.append(line)

    def wait_for(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, (
                f"exited {self.proc.returncode} before {text!r}: {self.stderr()[-3000:]}"
            )
            assert time.monotonic() < deadline, (
                f"no {text!r} within {timeout_s:.0f} s: {''.join(self.lines)[-2000:]}"
            )
            time.sleep(0.1)

    def finish(self, timeout_s: float) -> int:
        try:
            self.proc.wait(timeout_s)
        finally:
            self.kill()
        for reader in self._readers:
            reader.join(5)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stderr(self) -> str:
        return "".join(self.err)


def _trained_once(out: Path, topic: str, produced: int) -> checkpoint.State:
    """The run's checkpoint, after checking every produced record was trained exactly once."""
    state = checkpoint.load(out)
    assert state is not None
    ends = check_ledger(state.ledger)  # no gap, no overlap
    assert sum(ends.values()) == produced == state.extra["trained"], (ends, state.extra)
    assert set(ends) == {(topic, 0), (topic, 1)}
    return state


@pytest.mark.slow
def test_a_broker_restart_mid_run_loses_nothing(tmp_path: Path) -> None:
    """Proves: the broker stopped and restarted (same port, same data folder) while the run's
    replay is still sending and the run is training: the producer sends again what failed,
    the stream waits out the outage instead of failing, and every record is trained once.

    Slow: a broker of its own (Apache Kafka's JVM, its data kept in a folder) starts twice, and
    the run's replay is held to 150 records/s so that it is still sending when the broker stops:
    the 7,000 HIGGS records take 47 s, and the run trains them all across a 4 s outage."""
    port, storage, out = free_port("127.0.0.1"), tmp_path / "kafka", tmp_path / "run"
    # Apache Kafka's own broker, its data kept in a folder across the restart, as a user's.
    broker = EmbeddedBroker(engine="kafka", port=port, storage=str(storage)).start()
    try:
        # 7,000 records at 150/s take 47 s: the replay is still sending at the first batch
        # (start-up takes 10-30 s on 2 busy cores).
        run = Cli(
            "run",
            "--dataset",
            "higgs",
            "--bootstrap",
            broker.bootstrap,
            "--rate",
            "150",
            "--max-offsets-per-trigger",
            "500",
            "--eval-every",
            "100",
            "--out",
            str(out),
        )
        try:
            run.wait_for("batch    0 |", timeout_s=240)
            broker.stop()
            down_at = time.monotonic()
            # The outage itself is the fault: the stream plans no batch and the producer's
            # sends fail while it lasts.
            while time.monotonic() - down_at < 4:
                assert run.proc.poll() is None, run.stderr()[-3000:]
                time.sleep(0.1)
            broker = EmbeddedBroker(engine="kafka", port=port, storage=str(storage)).start()
            rc = run.finish(timeout_s=240)
        finally:
            run.kill()
        assert rc == 0, run.stderr()[-3000:]
    finally:
        broker.stop()
    produced = (out / "producer.log").read_text()
    assert f"sent {HIGGS_TRAIN} records" in produced and "0 send errors" in produced, produced[
        -2000:
    ]
    assert "ECONNREFUSED" in produced  # the replay was sending when the broker went away
    report = json.loads((out / "report.json").read_text())
    _trained_once(out, report["topic"], HIGGS_TRAIN)  # the run's own topic
    assert report["stopped_because"] == "all produced records trained"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs: a filesystem that really fills (needs root, as CI has)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited filesystem needs root (CI runs as root)")
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(folder: Path) -> Path:
    """Write zeros until the filesystem is full (at most its 64 MiB); return the file."""
    filler, block = folder / "filler", b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as f:
        for _ in range(80):
            try:
                f.write(block)
            except OSError as e:
                assert e.errno == errno.ENOSPC
                break
        else:
            raise AssertionError("the filesystem never filled")
    with contextlib.suppress(OSError), open(folder / "last", "wb", buffering=0) as f:
        while f.write(b"\0" * 4096):  # the last partial block
            pass
    return filler


def test_save_on_a_full_disk_raises_one_line_and_keeps_the_previous_checkpoint(
    small_disk: Path,
) -> None:
    """Proves: a checkpoint that cannot be written leaves the previous one whole and no
    temporary file behind, and says what to do."""
    import numpy as np

    checkpoint.save(
        small_disk, checkpoint.State(np.arange(1000, dtype=np.float32), clock=3, last_batch_id=3)
    )
    _fill(small_disk)
    with pytest.raises(checkpoint.CheckpointError, match="batch 4 is not committed.*--resume"):
        checkpoint.save(
            small_disk, checkpoint.State(np.zeros(100_000, np.float32), clock=4, last_batch_id=4)
        )
    kept = checkpoint.load(small_disk)
    assert kept is not None and kept.last_batch_id == 3 and kept.weights[999] == 999
    assert not list(small_disk.glob(".*.tmp"))


@pytest.mark.slow
def test_a_full_disk_stops_the_run_with_one_line_and_resume_loses_nothing(
    small_disk: Path,
    broker,  # type: ignore[no-untyped-def]
    topic: str,
    data_dir: Path,
) -> None:
    """Proves: the disk under the run's folder fills mid-run; the run stops with one line and
    a non-zero exit, commits nothing it could not checkpoint, and once space returns,
    --resume trains every record exactly once.

    Slow: two runs of `streamtrain run` (Spark, the parameter server, TensorFlow workers): one
    trains 250-record batches until batch 1's line and stops once the disk fills under it; its
    resume streams until its 30 s --timeout (the topic is the test's: no end is known)."""
    produced = (
        Replay(
            datasets.get("higgs", data_dir=data_dir),
            bootstrap=broker.bootstrap,
            topic=topic,
            partitions=2,
        )
        .run()
        .records_sent
    )
    out = small_disk / "run"
    common = [
        "--dataset",
        "higgs",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
        "--max-offsets-per-trigger",
        "250",
        "--eval-every",
        "1000",
    ]
    run = Cli("run", *common, "--out", str(out))
    try:
        run.wait_for("batch    1 |", timeout_s=240)
        filler = _fill(small_disk)
        rc = run.finish(timeout_s=120)
    finally:
        run.kill()
    err = run.stderr()
    assert rc == 2, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("streamtrain: error: ") and "no space left on device" in last.lower(), (
        err[-3000:]
    )
    assert "Traceback" not in err, err[-3000:]
    stopped = checkpoint.load(out)
    assert stopped is not None and stopped.extra["trained"] < produced

    filler.unlink()
    (small_disk / "last").unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", *common, "--resume", str(out), "--timeout", "30"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    _trained_once(out, topic, produced)
    # Every batch's row went to batches.jsonl as it came, across the stop and the resume.
    rows = [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines()]
    assert sum(r["trained"] for r in rows) >= produced and all(r["checkpoint_ms"] > 0 for r in rows)
