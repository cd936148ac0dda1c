"""A wrong Java (issue 29): one line before anything starts, not Spark's JAVA_GATEWAY_EXITED."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import config
from pipeline.cluster import jvmcache
from pipeline.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fresh_settings() -> Iterator[None]:
    config.settings.cache_clear()
    yield
    config.settings.cache_clear()


def test_a_java_home_without_java_is_refused_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_settings: None
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match=f"JAVA_HOME={tmp_path}, which has none"):
        jvmcache.check_java()
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "java").write_text("")  # there, but no program
    with pytest.raises(ConfigError, match="JAVA_HOME"):
        jvmcache.check_java()


def test_the_java_on_path_is_fine(monkeypatch: pytest.MonkeyPatch, fresh_settings: None) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    jvmcache.check_java()  # this machine's, as Spark's launcher finds it


def test_a_run_with_a_wrong_java_home_stops_in_one_line_before_anything_starts(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            "--dataset",
            "higgs",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "JAVA_HOME": str(tmp_path / "no-jdk")},
    )
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("streamtrain: error:")]
    assert len(errors) == 1 and f"JAVA_HOME={tmp_path / 'no-jdk'}" in errors[0], done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "JAVA_GATEWAY_EXITED" not in done.stderr
    assert "embedded Kafka at" not in done.stderr and not (tmp_path / "run").exists()
