"""streamtrain on a Spark standalone cluster across hosts: three network namespaces (the
driver with Kafka and Spark's master, and two worker hosts), each process inside its
host, Spark's RPC authenticated and encrypted. The test process only reads files."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.cluster import security
from tests.cluster import multihost, netns, proc_scan
from tests.cluster.test_task_retry import assert_applied_once

PRODUCED = 6000
_CANNOT = netns.missing()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_CANNOT is not None, reason=_CANNOT or "")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[multihost.Cluster]:
    """Hosts driver (Kafka, Spark's master), worker-a and worker-b (a 1-core Spark worker each)."""
    with multihost.running(tmp_path_factory.mktemp("multihost")) as c:
        yield c


def _train(
    cluster: multihost.Cluster, folder: Path, topic: str, *args: str, conf: Path | None = None
) -> dict[str, Any]:
    """Produce 6,000 MNIST records to ``topic`` and train them on the cluster from the
    driver's host; the run's report, after checking every task exchanged over TCP."""
    cluster.produce("mnist", topic, PRODUCED)
    out, log = folder / "run", folder / "run.log"
    run = cluster.streamtrain(
        "driver",
        "run",
        "--dataset",
        "mnist",
        "--master",
        cluster.spark.master,
        "--spark-conf",
        str(conf or cluster.spark.conf),
        "--bootstrap",
        cluster.bootstrap,
        "--topic",
        topic,
        "--max-offsets-per-trigger",
        "3000",
        "--max-batches",
        "2",
        "--eval-every",
        "2",
        "--out",
        str(out),
        *args,
        log=log,
    )
    try:
        assert run.wait(600) == 0, log.read_text(errors="replace")[-4000:]
    finally:
        multihost.stop(run)
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    assert {t["transport"] for row in report["batches"] for t in row["tasks"]} == {"tcp"}
    assert report["parameter_server"]["shared_memory"] == 0
    return report


def test_mnist_trains_once_across_hosts_over_tcp_through_an_executor_kill(
    cluster: multihost.Cluster, tmp_path: Path
) -> None:
    """Proves: `streamtrain run --master spark://DRIVER:7077` with the workers on two other
    hosts: the executors read Kafka and reach the parameter server over the network (TCP,
    as the report says for every task); an executor JVM SIGKILLed (by pid, inside its host)
    after a task's second exchange is replaced and the task run again; every MNIST record
    is trained once (ledger), each range's mini-batches applied once by the server's count,
    and the model learned (held-out accuracy far above chance). The parameter server runs
    as two shard processes (``--ps-shards 2``): the retried task is applied once on both.

    Slow: as the module's first test it pays for the module's cluster (Apache Kafka's broker,
    Spark's master and two workers in three network namespaces); then 6,000 MNIST records are
    produced and trained in two micro-batches by executors on the other hosts, one executor
    SIGKILLed and replaced by a new JVM before its task runs again."""
    marker = tmp_path / "killed"
    conf = tmp_path / "driver.conf"
    conf.write_text(
        cluster.spark.conf.read_text() + "spark.task.maxFailures 4\n"
        f"spark.executorEnv.STREAMTRAIN_FAULT exchange:2:executor:{marker}\n"
    )
    conf.chmod(0o600)
    secret = security.read_properties(conf)["spark.authenticate.secret"]
    with proc_scan.Watch(secret) as watch:
        report = _train(cluster, tmp_path, "mnist-multihost", "--ps-shards", "2", conf=conf)
    assert report["parameter_server"]["shards"] == 2
    assert marker.is_file()
    assert watch.scans > 10
    # Spark's worker hands each executor the secret in its environment (_SPARK_AUTH_SECRET,
    # readable by its owner only); nothing else carries it, and no command line does.
    assert {pid: w for pid, w in watch.found.items() if not _executor_environment(w)} == {}
    retried = assert_applied_once(
        report, tmp_path / "run", PRODUCED, batch_size=64
    )  # sync: 128 over 2 workers
    assert retried, report["batches"]
    assert report["final"]["accuracy"] > 0.5  # chance is 0.1


def _executor_environment(where: str) -> bool:
    """Whether a carrier is an executor (or a process it started) by its environment only."""
    return where.startswith("environ [executor]:")


_PROBE = """
import socket, sys
for port in map(int, sys.argv[2:]):
    try:
        socket.create_connection((sys.argv[1], port), timeout=5).close()
        print(port, "open")
    except OSError as e:
        print(port, type(e).__name__)
"""


def test_the_master_takes_no_rest_submission_from_another_host(cluster: multihost.Cluster) -> None:
    """Proves: from worker-a's host, the master's RPC port (7077) accepts a connection and
    its REST submission port (6066, unauthenticated) is closed."""
    done = subprocess.run(
        [
            *cluster.hosts.run("worker-a"),
            sys.executable,
            "-c",
            _PROBE,
            cluster.hosts.address["driver"],
            "7077",
            "6066",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.split("\n")[:2] == ["7077 open", "6066 ConnectionRefusedError"], done.stderr[
        -2000:
    ]
