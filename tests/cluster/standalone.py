"""A real Spark standalone cluster for tests: Spark's own master and workers, started with
``streamtrain spark-master`` and ``spark-worker`` (``spark-class`` from the pyspark wheel,
in the foreground), as the cluster guide starts them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.ingest.kafka.broker import free_port

ROOT = Path(__file__).resolve().parents[2]


class Standalone:
    """A master on ``host`` and a worker of ``cores`` cores on each of ``worker_hosts``,
    reading the properties file ``conf`` (the cluster's secret); stopped by pid.

    Args:
        folder: logs, and the workers' folders (each executor's stdout and stderr).
        conf: the properties file the master and workers start with.
        prefixes: the command each process runs under (``ip netns exec NAME`` for a host
            in a network namespace), in the order master, workers.
    """

    def __init__(
        self,
        folder: Path,
        conf: Path,
        *,
        host: str = "127.0.0.1",
        worker_hosts: list[str] | None = None,
        cores: int = 1,
        prefixes: list[list[str]] | None = None,
    ) -> None:
        self.folder, self.conf, self.host = folder, conf, host
        # On loopback, a free port; on a namespace's address, Spark's own (the namespace is ours).
        self.port = free_port(host) if host == "127.0.0.1" else 7077
        self.worker_hosts = worker_hosts or [host, host]
        self.cores = cores
        self.prefixes = prefixes or [[] for _ in range(len(self.worker_hosts) + 1)]
        # Executors run the driver's Python (PYSPARK_PYTHON travels with the tasks) and import
        # this checkout of the project, wherever the venv's editable install points.
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def master(self) -> str:
        return f"spark://{self.host}:{self.port}"

    def _start(self, name: str, prefix: list[str], args: list[str], env: dict[str, str]) -> Path:
        log = self.folder / f"{name}.log"
        with open(log, "wb") as f:
            self.procs.append(
                subprocess.Popen(
                    [*prefix, sys.executable, "-m", "pipeline", *args],
                    cwd=ROOT,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            )
        return log

    def start(self, timeout_s: float = 120) -> Standalone:
        self.folder.mkdir(parents=True, exist_ok=True)
        master_log = self._start(
            "master",
            self.prefixes[0],
            [
                "spark-master",
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--webui-port",
                "0",
                "--properties-file",
                str(self.conf),
            ],
            self.env,
        )
        self._wait(master_log, "I have been elected leader", timeout_s)
        logs = []
        for i, host in enumerate(self.worker_hosts):
            work = self.folder / f"worker-{i}"
            logs.append(
                self._start(
                    f"worker-{i}",
                    self.prefixes[i + 1],
                    [
                        "spark-worker",
                        self.master,
                        "--host",
                        host,
                        "--cores",
                        str(self.cores),
                        "--memory",
                        "3g",
                        "--webui-port",
                        "0",
                        "--work-dir",
                        str(work),
                        "--properties-file",
                        str(self.conf),
                    ],
                    self.env,
                )
            )
        for log in logs:
            self._wait(log, "Successfully registered with master", timeout_s)
        return self

    def _wait(self, log: Path, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in log.read_text(errors="replace"):
            dead = [p for p in self.procs if p.poll() is not None]
            assert not dead, f"a Spark process exited: {log.read_text(errors='replace')[-3000:]}"
            assert time.monotonic() < deadline, (
                f"no {text!r} within {timeout_s:.0f} s: {log.read_text()[-3000:]}"
            )
            time.sleep(0.2)

    def executor_logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.folder.glob("worker-*/*/*/stderr"))
        )

    def stop(self) -> None:
        """SIGTERM each process's group (a worker's executors with it), then SIGKILL what stays."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
