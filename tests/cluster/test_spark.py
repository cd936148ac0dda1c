"""The Spark session's JVM class archive: recorded by the first run, used by the next."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_START = """
import sys
from pipeline import cluster
s = cluster.session("local[1]", conf={"spark.driver.extraJavaOptions": sys.argv[1]})
assert s.range(3).count() == 3
cluster.stop(s)
"""


def _start(cache: Path, java_options: str = "") -> None:
    env = {**os.environ, "STREAMTRAIN_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", _START, java_options],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _built_archive(cache: Path) -> Path:
    """The archive the background build leaves, once it is done (it runs at nice 19)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        files = sorted(p.name for p in (cache / "jvm").iterdir())
        if not any(name.endswith(".part") for name in files) and any(
            n.endswith(".jsa") for n in files
        ):
            break
        time.sleep(1)
    [archive] = (cache / "jvm").glob("*.jsa")
    return archive


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache whose first session recorded the class archive and the build finished
    (built once: it takes a session and a JVM dump at nice 19)."""
    cache = tmp_path_factory.mktemp("jvm-cache")
    _start(cache)
    _built_archive(cache)
    return cache


@pytest.mark.slow  # Spark's JVM twice, and the archive's build at nice 19
def test_the_first_session_records_the_class_archive_and_the_next_maps_it(
    recorded: Path, tmp_path: Path
) -> None:
    """Proves: the class archive the first Spark session recorded is mapped by the next
    session's JVM (SparkContext loads from the shared objects file), and nothing is recorded
    again.

    Slow: mostly the set-up of the module's `recorded` fixture, which this test, the module's
    first, pays for: a Spark session whose loaded classes a background build at nice 19 dumps
    into the archive (waited for, up to 300 s); then the second session's JVM, which the check
    needs."""
    cache = tmp_path / "cache"
    shutil.copytree(recorded, cache)
    [archive] = (cache / "jvm").glob("*.jsa")
    assert archive.stat().st_size > 10_000_000
    assert not list((cache / "jvm").glob("*.part"))  # class list and partial archive cleaned up

    loaded = tmp_path / "classes.log"
    _start(cache, f"-Xlog:class+load=info:file={loaded}")
    lines = loaded.read_text().splitlines()
    spark_context = [line for line in lines if " org.apache.spark.SparkContext " in line]
    assert spark_context and "source: shared objects file" in spark_context[0], spark_context
    assert not list((cache / "jvm").glob("*.part"))  # used, not recorded again


@pytest.mark.slow  # Spark's JVM twice, and the archive's build at nice 19
def test_a_damaged_archive_is_refused_and_spark_starts_without_it(
    recorded: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    shutil.copytree(recorded, cache)
    [archive] = (cache / "jvm").glob("*.jsa")
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF
    archive.write_bytes(bytes(data))

    loaded = tmp_path / "classes.log"
    _start(cache, f"-Xlog:class+load=info:file={loaded}")
    spark_context = [
        line
        for line in loaded.read_text().splitlines()
        if " org.apache.spark.SparkContext " in line
    ]
    assert spark_context and "shared objects file" not in spark_context[0], spark_context


def test_the_class_archive_can_be_turned_off(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "STREAMTRAIN_CACHE_DIR": str(tmp_path),
        "STREAMTRAIN_JVM_CLASS_CACHE": "false",
    }
    code = "from pipeline.cluster import jvmcache; print(jvmcache.options())"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.stdout.strip() == "[]" and not (tmp_path / "jvm").exists(), done.stderr
