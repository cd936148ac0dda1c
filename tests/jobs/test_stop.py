"""A run stopped as operators stop it: SIGTERM (``docker compose stop``, a supervisor) or
Ctrl-C in a terminal (SIGINT to the whole process group). It finishes the batch in flight,
writes its checkpoint, model, report and picture, exits 0 with no traceback, and a resume
trains every remaining record once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.train import checkpoint
from pipeline.train.ledger import check_ledger
from producers import Replay, datasets

ROOT = Path(__file__).resolve().parents[2]


def _wait_for(path: Path, text: str, proc: subprocess.Popen[str], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (path.read_text() if path.exists() else ""):
        assert proc.poll() is None, f"the run ended before {text!r}: {path.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in {timeout_s} s"
        time.sleep(0.2)


@pytest.mark.slow  # a run stopped after two batches, and (SIGTERM) its resume
@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_a_stopped_run_leaves_its_report_and_model_and_resumes(how: str, broker, topic, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                               data_dir: Path) -> None:
    """Proves: the signal stops the run after the batch in flight, within a bound, exit 0,
    no traceback; report.json (saying why it stopped), report.png and model.keras are
    written and the report's count is the checkpoint's; the broker, a child of the run,
    outlived a terminal's Ctrl-C to the group until the run stopped it. After SIGTERM,
    --resume trains the rest: every record once."""
    produced = Replay(datasets.get("higgs", data_dir=data_dir), bootstrap=broker.bootstrap, topic=topic,
                      partitions=2).run().records_sent
    out = tmp_path / "run"
    common = ["--dataset", "higgs", "--bootstrap", broker.bootstrap, "--topic", topic,
              "--max-offsets-per-trigger", "500", "--eval-every", "100"]
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with stdout.open("w") as o, stderr.open("w") as e:
        # Its own session: a Ctrl-C reaches a terminal's whole foreground group, as here.
        proc = subprocess.Popen([sys.executable, "-m", "pipeline", "run", *common, "--out", str(out)], cwd=ROOT,
                                stdout=o, stderr=e, text=True, start_new_session=True)
    try:
        _wait_for(stdout, "batch    1 |", proc)
        stopped_at = time.monotonic()
        if how == "SIGTERM":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - stopped_at
    log = stderr.read_text()
    assert rc == 0 and "Traceback" not in log, log[-3000:]
    assert took < 60, took
    name = "SIGTERM" if how == "SIGTERM" else "SIGINT"
    report = json.loads((out / "report.json").read_text())
    assert report["stopped_because"].startswith(f"{name}: stopped after the batch in flight"), report["stopped_because"]
    assert (out / "model.keras").stat().st_size > 0 and (out / "report.png").stat().st_size > 0
    state = checkpoint.load(out)
    assert state is not None and 0 < report["trained_records"] == state.extra["trained"] < produced
    if how != "SIGTERM":
        return
    done = subprocess.run([sys.executable, "-m", "pipeline", "run", "--resume", str(out), "--timeout", "20"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    final = checkpoint.load(out)
    assert final is not None
    ends = check_ledger(final.ledger)  # no gap, no overlap across the stop
    assert sum(ends.values()) == produced == final.extra["trained"]
