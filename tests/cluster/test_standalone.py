"""`streamtrain spark-master` and `spark-worker`'s command lines (issue 29): the option a worker
is told to pass is its own, and its work folder is the user's, not inside the pyspark package."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import config
from pipeline.cluster import standalone
from pipeline.errors import ConfigError


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("STREAMTRAIN_CACHE_DIR", str(tmp_path / "cache"))
    config.settings.cache_clear()
    yield tmp_path / "cache"
    config.settings.cache_clear()


def test_a_worker_without_a_properties_file_is_told_its_own_option(cache: Path) -> None:
    with pytest.raises(
        ConfigError, match="^Expected --properties-file FILE with spark.authenticate true"
    ):
        standalone.command(
            "worker", host="127.0.0.1", port=0, properties=None, master="spark://10.0.0.1:7077"
        )


def test_a_workers_folders_default_to_the_users_cache_not_the_pyspark_package(
    cache: Path, tmp_path: Path
) -> None:
    args = standalone.command(
        "worker", host="127.0.0.1", port=0, properties=None, master="spark://127.0.0.1:7077"
    )
    work = Path(args[args.index("--work-dir") + 1])
    assert work == (cache / "spark-work").resolve() and work.is_dir()
    assert standalone.spark_home().resolve() not in work.parents
    given = standalone.command(
        "worker",
        host="127.0.0.1",
        port=0,
        properties=None,
        master="spark://127.0.0.1:7077",
        work_dir=str(tmp_path / "w"),
    )
    assert given[given.index("--work-dir") + 1] == str((tmp_path / "w").resolve())


def test_cluster_conf_fixes_the_drivers_ports_for_a_firewall(tmp_path: Path) -> None:
    """Proves: the generated file sets spark.driver.port and spark.blockManager.port (Spark's
    default is a new random port every run) beside the secret (issue 43)."""
    from pipeline.cluster import security

    props = security.read_properties(security.write_conf(tmp_path / "auth.conf"))
    assert props["spark.driver.port"] == "7078" and props["spark.blockManager.port"] == "7079"
    assert props["spark.authenticate.secret"]


def test_cluster_status_of_a_master_it_cannot_read_is_one_line(tmp_path: Path) -> None:
    """Proves: with no master's web UI answering, `cluster-status` says so in one line, naming
    the SSH tunnel, and exits 2."""
    import os
    import subprocess
    import sys

    from pipeline.ingest.kafka.broker import free_port

    url = f"http://127.0.0.1:{free_port('127.0.0.1')}"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "cluster-status",
            "spark://127.0.0.1:7077",
            "--webui",
            url,
        ],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert (
        f"Cannot read the master's web UI at {url}" in done.stderr
        and "ssh -N -L 8080" in done.stderr
    )
