"""The README's first command runs the main job on its embedded default."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow  # one epoch of MNIST
def test_streamtrain_run_on_its_embedded_default(tmp_path: Path) -> None:
    # Exactly the quickstart (`streamtrain run`), with the output folder kept out of the tree.
    done = subprocess.run([sys.executable, "-m", "pipeline", "run"], capture_output=True, text=True, timeout=900,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    accuracy = float(re.search(r"held-out accuracy (\d\.\d+)", done.stdout.splitlines()[-2]).group(1))  # type: ignore[union-attr]
    assert accuracy > 0.95  # one pass of MNIST through dist-keras's CNN
    [report] = list((tmp_path / "runs").glob("mnist-*/report.json"))
    assert json.loads(report.read_text())["trained_records"] == 60_000
