"""The README's first command runs the main job on its embedded default."""

from __future__ import annotations

import subprocess
import sys


def test_streamtrain_run_on_its_embedded_default() -> None:
    done = subprocess.run([sys.executable, "-m", "pipeline", "run"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "sent 60000 records" in done.stdout
    assert "read back 60000 records from mnist: 60000 decoded, rejected none" in done.stdout
