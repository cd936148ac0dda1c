"""A driver that cannot reach its cluster, or that the cluster cannot reach (issue 29): one
line within a bound, naming what is unreachable, instead of a run that hangs printing
Spark's "Initial job has not accepted any resources" every 15 s."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.cluster import reach, security
from pipeline.ingest.kafka.broker import free_port
from tests.cluster.standalone import Standalone

ROOT = Path(__file__).resolve().parents[2]


def _run(
    *args: str, env: dict[str, str] | None = None, timeout_s: float
) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            "--dataset",
            "higgs",
            "--max-batches",
            "1",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    return done, time.monotonic() - began


def _one_error(done: subprocess.CompletedProcess[str]) -> str:
    errors = [line for line in done.stderr.splitlines() if line.startswith("streamtrain: error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "Initial job has not accepted any resources" not in done.stderr
    return errors[0]


def test_the_driver_advertises_the_address_it_is_given_or_its_route_to_the_master() -> None:
    assert reach.driver_address("spark://10.0.0.1:7077", "10.0.0.9") == "10.0.0.9"
    assert reach.driver_address("spark://127.0.0.1:7077", None) == "127.0.0.1"


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_an_unreachable_master_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    """Proves: a master nobody listens on stops the run in one line naming it, before the
    broker starts (Spark alone retries for a minute, then fails in a traceback)."""
    master = f"spark://127.0.0.1:{free_port('127.0.0.1')}"
    done, took = _run(
        "--master",
        master,
        "--out",
        str(tmp_path / "run"),
        env={"STREAMTRAIN_MASTER_WAIT_S": "3"},
        timeout_s=60,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"Cannot reach Spark's master at {master} from this host within 3 s" in _one_error(done)
    assert took < 30 and "embedded Kafka at" not in done.stderr


@pytest.mark.slow
def test_a_driver_its_executors_cannot_reach_stops_in_one_line(tmp_path: Path) -> None:
    """Proves: a driver advertising an address its executors cannot reach (as a host name
    other hosts could not resolve did) stops within STREAMTRAIN_EXECUTOR_WAIT_S with one
    line naming that address, and leaves no Spark process of its own.

    Slow: a Spark standalone master and worker (a JVM each) start first; then the run starts its
    own Apache Kafka broker and replay, and waits out the 15 s STREAMTRAIN_EXECUTOR_WAIT_S on
    purpose before its one line."""
    conf = security.write_conf(tmp_path / "auth.conf")
    spark = Standalone(tmp_path / "spark", conf, worker_hosts=["127.0.0.1"]).start()
    try:
        driver_conf = tmp_path / "driver.conf"
        driver_conf.write_text(
            conf.read_text() + "spark.driver.host 127.0.0.3\n"
        )  # bound to 127.0.0.1 only
        driver_conf.chmod(0o600)
        done, took = _run(
            "--master",
            spark.master,
            "--spark-conf",
            str(driver_conf),
            "--out",
            str(tmp_path / "run"),
            env={"STREAMTRAIN_EXECUTOR_WAIT_S": "15"},
            timeout_s=300,
        )
    finally:
        spark.stop()
    assert done.returncode != 0
    line = _one_error(done)
    assert (
        "No Spark executor registered within 15 s" in line and "this driver at 127.0.0.3:" in line
    ), line
    assert "SPARK_LOCAL_IP" in line
