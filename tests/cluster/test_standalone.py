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
    with pytest.raises(ConfigError, match="^Expected --properties-file FILE with spark.authenticate true"):
        standalone.command("worker", host="127.0.0.1", port=0, properties=None, master="spark://10.0.0.1:7077")


def test_a_workers_folders_default_to_the_users_cache_not_the_pyspark_package(cache: Path, tmp_path: Path) -> None:
    args = standalone.command("worker", host="127.0.0.1", port=0, properties=None, master="spark://127.0.0.1:7077")
    work = Path(args[args.index("--work-dir") + 1])
    assert work == (cache / "spark-work").resolve() and work.is_dir()
    assert standalone.spark_home().resolve() not in work.parents
    given = standalone.command("worker", host="127.0.0.1", port=0, properties=None, master="spark://127.0.0.1:7077",
                               work_dir=str(tmp_path / "w"))
    assert given[given.index("--work-dir") + 1] == str((tmp_path / "w").resolve())
