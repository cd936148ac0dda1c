"""A cluster's doors: the secret never on a command line (PySpark's launch of the driver
JVM), and no unauthenticated job submission on the master (its REST server)."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.ingest.kafka.broker import free_port
from tests.cluster import proc_scan
from tests.cluster.multihost import stop, wait_for

ROOT = Path(__file__).resolve().parents[2]

_START = """
import sys
from pipeline import cluster
secret = sys.stdin.readline().strip()
conf = {"spark.authenticate": "true", "spark.authenticate.secret": secret}
s = cluster.session("local[1]", conf=conf)
got = s.sparkContext.getConf().get("spark.authenticate.secret")
assert got == secret, "the JVM lacks the secret"
assert s.range(3).count() == 3
print("ready", flush=True)
sys.stdin.readline()
cluster.stop(s)
"""


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_the_driver_jvm_gets_the_secret_through_a_file_not_its_command_line(tmp_path: Path) -> None:
    """Proves: a session whose settings hold ``spark.authenticate.secret`` starts a driver JVM
    that has the secret (its SparkConf, and a job runs with authentication on) while no
    process of this machine shows it in its command line or environment (the driver Python
    reads it from its stdin); the properties file it came through is gone."""
    secret = secrets.token_hex(16)
    env = {**os.environ, "STREAMTRAIN_JVM_CLASS_CACHE": "false", "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _START],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        proc.stdin.write(secret + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()  # the child exits (EOF) if the session fails
        assert line == "ready\n", proc.communicate(timeout=60)[1][-3000:]
        assert proc_scan.carriers(secret) == {}
        assert not list(tmp_path.rglob("*.conf")), "the properties file was left behind"
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(120) == 0, proc.communicate()[1][-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_the_master_opens_no_rest_submission_port_and_its_ui_stays_on_its_host(
    tmp_path: Path,
) -> None:
    """Proves: ``streamtrain spark-master`` (as the cluster guide and compose start it) runs no REST
    submission server, which would run unauthenticated jobs, even with its port set: nothing
    listens there once the master leads, while its RPC port accepts; its web UI is bound to
    the address given as --host."""
    port, rest = free_port("127.0.0.1"), free_port("127.0.0.1")
    log = tmp_path / "master.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SPARK_MASTER_OPTS": f"-Dspark.master.rest.port={rest}",
    }
    with open(log, "wb") as f:
        master = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline",
                "spark-master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                "0",
            ],
            cwd=ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(log, "I have been elected leader", master, 120)
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # the probe can succeed
        try:
            socket.create_connection(("127.0.0.1", rest), timeout=5).close()
            raise AssertionError(f"the REST submission port {rest} accepted a connection")
        except ConnectionRefusedError:
            pass
        text = log.read_text(errors="replace")
        assert "REST server" not in text
        assert "Bound MasterWebUI to 127.0.0.1," in text
    finally:
        stop(master)
