"""A run's temporary folder: what a killed run left is removed by the next start, what a
live run holds is not, and the folder is refused where others could reach into it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.cluster import scratch
from pipeline.errors import ConfigError
from tests.conftest import ROOT

#: A process that holds a run's folder, writes a file there as TensorFlow would, and says where.
_HOLD = (
    "import sys, tempfile, time\nfrom pipeline.cluster import scratch\nwith "
    "scratch.scratch(sys.argv[1]) as folder:\n    "
    "tempfile.NamedTemporaryFile(prefix='__autograph_generated_file', suffix='.py', "
    "delete=False).close()\n    print(folder, flush=True)\n    time.sleep(120)\n"
)


@pytest.fixture
def parent() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="st-scratch-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _hold(parent: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(parent)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


def test_a_killed_runs_folder_goes_at_the_next_start_and_a_live_ones_stays(parent: Path) -> None:
    """Proves: SIGKILL leaves a run's temporary files (TensorFlow's among them) in its
    folder alone, and the next run's start removes that folder, not a live run's."""
    killed, left = _hold(parent)
    live, held = _hold(parent)
    try:
        assert list(left.glob("__autograph_generated_file*.py")), list(left.iterdir())
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        assert left.is_dir()  # a kill cleans nothing up
        with scratch.scratch(parent) as mine:
            assert not left.exists() and held.is_dir() and mine.is_dir()
            assert (
                tempfile.gettempdir()
                == str(mine)
                == os.environ["TMPDIR"]
                == os.environ["SPARK_LOCAL_DIRS"]
            )
            assert os.environ["SPARK_SUBMIT_OPTS"].endswith(
                f"-Djava.io.tmpdir={mine}"
            )  # Spark's JVM
        assert (
            not mine.exists()
            and tempfile.gettempdir() != str(mine)
            and os.environ.get("TMPDIR") != str(mine)
        )
    finally:
        for proc in (killed, live):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_folder_others_can_write_to_is_refused(parent: Path) -> None:
    folder = parent / f"streamtrain-{os.getuid()}"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    with pytest.raises(ConfigError, match="a folder of this user's alone"), scratch.scratch(parent):
        pass
