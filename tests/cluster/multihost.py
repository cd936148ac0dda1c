"""A streamtrain deployment across hosts for tests and benchmarks: three network
namespaces (``driver`` with Kafka and Spark's master, ``worker-a`` and ``worker-b`` with a
Spark worker each), Spark's RPC authenticated and encrypted. Every process runs inside its
host; the caller reads results from files. Root only (see :mod:`tests.cluster.netns`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.cluster import security
from producers import datasets
from tests.cluster import netns
from tests.cluster.standalone import Standalone

ROOT = Path(__file__).resolve().parents[2]
KAFKA_PORT = 9092


class Cluster:
    """The hosts, Spark's master and workers, the broker, and the environment of
    streamtrain's processes (a cache folder of their own: the broker records itself there)."""

    def __init__(self, hosts: netns.Hosts, folder: Path, cores: int = 1) -> None:
        self.hosts, self.folder = hosts, folder
        folder.mkdir(parents=True, exist_ok=True)
        self.spark = Standalone(
            folder / "spark",
            security.write_conf(folder / "auth.conf"),
            host=hosts.address["driver"],
            worker_hosts=[hosts.address["worker-a"], hosts.address["worker-b"]],
            cores=cores,
            prefixes=[hosts.run("driver"), hosts.run("worker-a"), hosts.run("worker-b")],
        )
        cache = folder / "cache"
        cache.mkdir(exist_ok=True)
        (cache / "mnist.npz").symlink_to(datasets.mnist.fetch())
        # No class archive for the JVM: its background build would compete for the cores.
        self.env = {
            **os.environ,
            "STREAMTRAIN_CACHE_DIR": str(cache),
            "PYTHONPATH": str(ROOT),
            "STREAMTRAIN_JVM_CLASS_CACHE": "false",
        }
        self.bootstrap = f"{hosts.address['driver']}:{KAFKA_PORT}"
        self._broker: subprocess.Popen[bytes] | None = None

    def streamtrain(self, host: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
        """``streamtrain ARGS`` on ``host``, its output in ``log``."""
        env = {**self.env, "SPARK_LOCAL_IP": self.hosts.address[host]}
        with open(log, "wb") as f:
            return subprocess.Popen(
                [*self.hosts.run(host), sys.executable, "-m", "pipeline", *args],
                cwd=ROOT,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def produce(self, dataset: str, topic: str, limit: int) -> None:
        """Replay ``limit`` records of ``dataset`` into ``topic``, from the driver's host."""
        done = subprocess.run(
            [
                *self.hosts.run("driver"),
                sys.executable,
                "-m",
                "pipeline",
                "produce",
                dataset,
                "--bootstrap",
                self.bootstrap,
                "--topic",
                topic,
                "--limit",
                str(limit),
            ],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]

    def start(self) -> Cluster:
        log = self.folder / "broker.log"
        self._broker = self.streamtrain(
            "driver",
            "broker",
            "--host",
            self.hosts.address["driver"],
            "--port",
            str(KAFKA_PORT),
            log=log,
        )
        wait_for(log, "Ctrl-C stops it", self._broker, 60)
        self.spark.start()
        return self

    def stop(self) -> None:
        self.spark.stop()
        if self._broker is not None:
            stop(self._broker)


@contextlib.contextmanager
def running(folder: Path, cores: int = 1) -> Iterator[Cluster]:
    """Hosts up, the cluster started; everything stopped by pid and every namespace removed
    afterwards."""
    with netns.Hosts(["driver", "worker-a", "worker-b"]) as hosts:
        cluster = Cluster(hosts, folder, cores)
        try:
            yield cluster.start()
        finally:
            cluster.stop()


def wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text(errors="replace"):
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, (
            f"no {text!r} within {timeout_s:.0f} s: {log.read_text()[-3000:]}"
        )
        time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process's group, SIGKILL it if it stays."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
