"""streamtrain on a Spark standalone cluster across hosts: three network namespaces (the
driver with Kafka and Spark's master, and two worker hosts), each process inside its
host, Spark's RPC authenticated and encrypted. The test process only reads files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.cluster import security
from producers import datasets
from tests.cluster import netns
from tests.cluster.standalone import Standalone
from tests.cluster.test_task_retry import assert_applied_once

ROOT = Path(__file__).resolve().parents[2]
KAFKA_PORT = 9092
PRODUCED = 6000
_CANNOT = netns.missing()
pytestmark = pytest.mark.skipif(_CANNOT is not None, reason=_CANNOT or "")


class Cluster:
    """The hosts, the cluster's properties file, and the environment of streamtrain's
    processes (a cache folder of their own: the broker they start records itself there)."""

    def __init__(self, hosts: netns.Hosts, spark: Standalone, folder: Path) -> None:
        self.hosts, self.spark, self.folder = hosts, spark, folder
        cache = folder / "cache"
        cache.mkdir(exist_ok=True)
        (cache / "mnist.npz").symlink_to(datasets.mnist.fetch())
        # No class archive for the JVM: its background build would compete for the cores.
        self.env = {**os.environ, "STREAMTRAIN_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT),
                    "STREAMTRAIN_JVM_CLASS_CACHE": "false"}
        self.bootstrap = f"{hosts.address['driver']}:{KAFKA_PORT}"

    def streamtrain(self, host: str, *args: str, log: Path, extra_env: dict[str, str] | None = None,
                    ) -> subprocess.Popen[bytes]:
        """``streamtrain ARGS`` on ``host``, its output in ``log``."""
        env = {**self.env, "SPARK_LOCAL_IP": self.hosts.address[host], **(extra_env or {})}
        with open(log, "wb") as f:
            return subprocess.Popen([*self.hosts.run(host), sys.executable, "-m", "pipeline", *args], cwd=ROOT,
                                    env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, f"no {text!r} within {timeout_s:.0f} s: {log.read_text()[-3000:]}"
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Hosts driver (Kafka, Spark's master), worker-a and worker-b (a 1-core Spark worker
    each); everything stopped by pid and every namespace removed afterwards."""
    folder = tmp_path_factory.mktemp("multihost")
    with netns.Hosts(["driver", "worker-a", "worker-b"]) as hosts:
        spark = Standalone(folder / "spark", security.write_conf(folder / "auth.conf"), host=hosts.address["driver"],
                           worker_hosts=[hosts.address["worker-a"], hosts.address["worker-b"]],
                           prefixes=[hosts.run("driver"), hosts.run("worker-a"), hosts.run("worker-b")])
        c = Cluster(hosts, spark, folder)
        broker_log = folder / "broker.log"
        broker = c.streamtrain("driver", "broker", "--host", hosts.address["driver"], "--port", str(KAFKA_PORT),
                               log=broker_log)
        try:
            _wait_for(broker_log, "Ctrl-C stops it", broker, 60)
            spark.start()
            yield c
        finally:
            spark.stop()
            _stop(broker)


def _train(cluster: Cluster, folder: Path, topic: str, *args: str, conf: Path | None = None) -> dict[str, Any]:
    """Produce 6,000 MNIST records to ``topic`` and train them on the cluster from the
    driver's host; the run's report."""
    produce = subprocess.run([*cluster.hosts.run("driver"), sys.executable, "-m", "pipeline", "produce", "mnist",
                              "--bootstrap", cluster.bootstrap, "--topic", topic, "--limit", str(PRODUCED)],
                             cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=300)
    assert produce.returncode == 0, produce.stderr[-3000:]
    out, log = folder / "run", folder / "run.log"
    run = cluster.streamtrain(
        "driver", "run", "--dataset", "mnist", "--master", cluster.spark.master,
        "--spark-conf", str(conf or cluster.spark.conf), "--bootstrap", cluster.bootstrap, "--topic", topic,
        "--max-offsets-per-trigger", "3000", "--max-batches", "2", "--eval-every", "2", "--out", str(out), *args,
        log=log)
    try:
        assert run.wait(600) == 0, log.read_text(errors="replace")[-4000:]
    finally:
        _stop(run)
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    assert {t["transport"] for row in report["batches"] for t in row["tasks"]} == {"tcp"}
    assert report["parameter_server"]["shared_memory"] == 0
    return report


def test_mnist_trains_once_across_hosts_over_tcp(cluster: Cluster, tmp_path: Path) -> None:
    """Proves: `streamtrain run --master spark://DRIVER:7077` with the workers on two other
    hosts: the executors read Kafka and reach the parameter server over the network (TCP,
    as the report says for every task), every MNIST record is trained once (ledger), each
    range's mini-batches were applied once by the server's count, and the model learned
    (held-out accuracy far above chance)."""
    report = _train(cluster, tmp_path, "mnist-multihost")
    assert_applied_once(report, tmp_path / "run", PRODUCED, batch_size=64)  # sync: 128 split over 2 workers
    assert report["final"]["accuracy"] > 0.5  # chance is 0.1


def test_an_executor_killed_on_another_host_trains_each_minibatch_once(cluster: Cluster, tmp_path: Path) -> None:
    """Proves: an executor JVM on a worker host SIGKILLed (by pid, inside its host) after a
    task's second exchange: Spark runs the task again on the cluster, and over TCP the
    server still applies every mini-batch of every range once, every record once."""
    marker = tmp_path / "killed"
    conf = tmp_path / "driver.conf"
    conf.write_text(cluster.spark.conf.read_text() + "spark.task.maxFailures 4\n"
                    f"spark.executorEnv.STREAMTRAIN_FAULT exchange:2:executor:{marker}\n")
    conf.chmod(0o600)
    report = _train(cluster, tmp_path, "mnist-multihost-kill", "--algorithm", "downpour", conf=conf)
    assert marker.is_file()
    retried = assert_applied_once(report, tmp_path / "run", PRODUCED, batch_size=128, window=5)
    assert retried, report["batches"]
