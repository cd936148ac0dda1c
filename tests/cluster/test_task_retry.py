"""Exactly once when Spark retries a task: a process killed mid-partition, the task run
again, and every mini-batch's update applied once, by the parameter server's own count.
Real broker, real Spark, real TensorFlow; the test reads the run's report and checkpoint."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.cluster import security
from pipeline.train import checkpoint
from pipeline.train.ledger import check_ledger
from producers import Replay, datasets
from tests.cluster.standalone import Standalone

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # full runs whose workers are killed, and a standalone cluster


def run_with_fault(
    out: Path, fault: str, *args: str, env: dict[str, str] | None = None, timeout_s: float = 300
) -> dict[str, Any]:
    """``streamtrain run ARGS`` with ``STREAMTRAIN_FAULT=fault``; its report, after checking
    that it exited 0."""
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", *args, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {}), "STREAMTRAIN_FAULT": fault},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return report


def assert_applied_once(
    report: dict[str, Any], out: Path, produced: int, batch_size: int, window: int | None = None
) -> list[dict[str, int]]:
    """Every task's mini-batches were applied once by the server's own count, every record
    trained once by the ledger; with an asynchronous algorithm's ``window``, the server's
    clock rose by exactly the exchanges of each batch. Returns the retried attempts' tasks."""
    tasks = [t for row in report["batches"] for t in row["tasks"]]
    for t in tasks:
        assert t["applied"] == t["steps"] == math.ceil(t["records"] / batch_size), t
    clock = 0
    for row in report["batches"] if window else []:
        assert row["clock"] - clock == sum(math.ceil(t["steps"] / window) for t in row["tasks"]), (
            row
        )
        clock = row["clock"]
    state = checkpoint.load(out)
    assert state is not None
    assert sum(check_ledger(state.ledger).values()) == produced == state.extra["trained"]
    return [t for t in tasks if t["attempt"] > 0]


@pytest.mark.parametrize(
    ("algorithm", "batch_size", "window"),
    [
        ("sync", 64, 1),  # synchronous rounds; 128 split over 2 workers, an exchange per mini-batch
        ("downpour", 128, 5),  # asynchronous deltas, an exchange every 5 mini-batches
    ],
)
def test_a_python_worker_killed_mid_partition_trains_each_minibatch_once(  # type: ignore[no-untyped-def]
    broker, topic: str, data_dir: Path, tmp_path: Path, algorithm: str, batch_size: int, window: int
) -> None:
    """Proves: with Spark's task retries on (local[2,4]: up to 4 attempts), the Python worker
    training a partition is SIGKILLed after its second exchange; Spark runs the task again,
    the retry skips the mini-batches of the two exchanges the server had applied, and every
    mini-batch of every range is applied exactly once (none twice, none lost) while every
    record is trained once."""
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
    out, marker = tmp_path / "run", tmp_path / "killed"
    report = run_with_fault(
        out,
        f"exchange:2:python:{marker}",
        "--dataset",
        "higgs",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
        "--algorithm",
        algorithm,
        "--master",
        "local[2,4]",
        "--max-offsets-per-trigger",
        "3500",
        "--max-batches",
        "2",
        "--eval-every",
        "1000",
    )
    assert marker.is_file()  # the fault fired: a worker died mid-partition
    retried = assert_applied_once(
        report, out, produced, batch_size=batch_size, window=None if algorithm == "sync" else window
    )
    # The kill comes right after the second exchange returned, so the server has applied
    # both (with --sync-overlap the second's push could still be in flight: one or two).
    assert retried and window <= retried[0]["skipped"] <= 2 * window, retried


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """Spark's standalone master and two 1-core workers on loopback, with RPC authentication
    and encryption from a `streamtrain cluster-conf` file, as the cluster guide starts them."""
    folder = tmp_path_factory.mktemp("standalone")
    cluster = Standalone(folder, security.write_conf(folder / "auth.conf"), cores=1)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def _driver_conf(cluster: Standalone, path: Path, settings: dict[str, str]) -> Path:
    """The cluster's properties file plus ``settings``, readable by its owner only."""
    extra = "".join(f"{k} {v}\n" for k, v in settings.items())
    path.write_text(cluster.conf.read_text() + extra)
    path.chmod(0o600)
    return path


def test_with_speculation_on_a_standalone_cluster_a_killed_worker_trains_each_minibatch_once(  # type: ignore[no-untyped-def]
    standalone: Standalone, broker, topic: str, data_dir: Path, tmp_path: Path
) -> None:
    """Proves: on Spark's standalone cluster (authenticated, encrypted RPC) with speculation
    on (a copy of any task running longer than half the finished one's time), a Python
    worker SIGKILLed mid-partition: Spark runs the task again, and the server applies every
    mini-batch of every range once, by its own count (and the clock rose by exactly the
    exchanges); every record is trained once. (An executor JVM killed: test_multihost.)

    Slow: the module's Spark standalone cluster (a master and two 1-core workers, a JVM each)
    starts with this test, its only user; then one `streamtrain run` whose executors start on it
    trains two 3,500-record HIGGS batches while a Python worker is killed and its task runs
    again."""
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
    out, marker = tmp_path / "run", tmp_path / "killed"
    conf = _driver_conf(
        standalone,
        tmp_path / "driver.conf",
        {
            "spark.task.maxFailures": "4",
            "spark.executorEnv.STREAMTRAIN_FAULT": f"exchange:2:python:{marker}",
            "spark.speculation": "true",
            "spark.speculation.multiplier": "0.5",
            "spark.speculation.quantile": "0.5",
            "spark.speculation.interval": "200ms",
        },
    )
    report = run_with_fault(
        out,
        "",
        "--dataset",
        "higgs",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
        "--algorithm",
        "downpour",
        "--master",
        standalone.master,
        "--spark-conf",
        str(conf),
        "--max-offsets-per-trigger",
        "3500",
        "--max-batches",
        "2",
        "--eval-every",
        "1000",
    )
    assert marker.is_file()
    retried = assert_applied_once(report, out, produced, batch_size=128, window=5)
    assert retried and retried[0]["skipped"] == 10, report["batches"]
