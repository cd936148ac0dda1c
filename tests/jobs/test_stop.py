"""A run stopped as operators stop it: SIGTERM (``docker compose stop``, a supervisor) or
Ctrl-C in a terminal (SIGINT to the whole process group). It finishes the batch in flight,
writes its checkpoint, model, report and picture, exits 0 with no traceback, and a resume
trains every remaining record once."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline.train import checkpoint
from pipeline.train.ledger import check_ledger
from producers import Replay, datasets
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def _wait_for(path: Path, text: str, proc: subprocess.Popen[str], timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in (path.read_text() if path.exists() else ""):
        assert proc.poll() is None, f"the run ended before {text!r}: {path.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in {timeout_s} s"
        time.sleep(0.2)


@pytest.mark.slow  # a run stopped after two batches, and (SIGTERM) its resume
# Each signal once and each source once: SIGTERM's resume reads through Spark's own source,
# whose offsets live in Spark's checkpoint (the Python source's resume is the driver-kill
# test's, tests/jobs/test_run.py).
@pytest.mark.parametrize(("how", "source"), [("Ctrl-C", "python"), ("SIGTERM", "jvm")])
def test_a_stopped_run_leaves_its_report_and_model_and_resumes(
    how: str,
    source: str,
    broker,
    topic,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    data_dir: Path,
) -> None:
    """Proves: the signal stops the run after the batch in flight, within a bound, exit 0,
    no traceback; report.json (saying why it stopped), report.png and model.keras are
    written and the report's count is the checkpoint's; the broker, a child of the run,
    outlived a terminal's Ctrl-C to the group until the run stopped it; no temporary file is
    left. After SIGTERM, --resume trains the rest, every record once, and from its start
    shows the run's totals and last score, serves the checkpoint, and says it truthfully.

    Slow: each case starts a `streamtrain run` (Spark, the parameter server, TensorFlow
    workers), lets it train until batch 1's line, then waits for it to finish the batch in
    flight and write its model, report and picture; after SIGTERM, the resume, serving and
    scraped, streams until its 20 s --timeout."""
    produced = (
        Replay(
            datasets.get("higgs", data_dir=data_dir),
            bootstrap=broker.bootstrap,
            topic=topic,
            partitions=2,
        )
        .run()
        .records_sent
    )
    out = tmp_path / "run"
    # A temp folder of the runs' own (short: the zygote's socket lives in it): every file they
    # and their processes make there (TensorFlow's traced functions too) is gone when they end.
    temp = Path(tempfile.mkdtemp(prefix="st-stop-"))
    env = {**os.environ, "TMPDIR": str(temp)}
    common = [
        "--dataset",
        "higgs",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
        "--max-offsets-per-trigger",
        "500",
        "--eval-every",
        "100",
        "--source",
        source,
    ]
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with stdout.open("w") as o, stderr.open("w") as e:
        # Its own session: a Ctrl-C reaches a terminal's whole foreground group, as here.
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "run", *common, "--out", str(out)],
            cwd=ROOT,
            stdout=o,
            stderr=e,
            text=True,
            start_new_session=True,
            env=env,
        )
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
    assert report["stopped_because"].startswith(f"{name}: stopped after the batch in flight"), (
        report["stopped_because"]
    )
    assert (out / "model.keras").stat().st_size > 0 and (out / "report.png").stat().st_size > 0
    state = checkpoint.load(out)
    assert state is not None and 0 < report["trained_records"] == state.extra["trained"] < produced
    assert _litter(temp) == [], _litter(temp)
    if how != "SIGTERM":
        shutil.rmtree(temp)
        return
    # The resume: from its first scrape, its counters are the checkpoint's totals and its
    # held-out score the last one measured; it serves before its first batch; its first line
    # says what Spark starts with.
    metrics_port, serve_port = free_port(), free_port()
    with stdout.open("w") as o:
        resumed = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline",
                "run",
                "--resume",
                str(out),
                "--timeout",
                "20",
                "--metrics-port",
                str(metrics_port),
                "--serve-port",
                str(serve_port),
            ],
            cwd=ROOT,
            stdout=o,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
    try:
        first_scrape = _poll(lambda: _get(f"http://127.0.0.1:{metrics_port}/metrics"), resumed)
        answered = _poll(lambda: _predict(serve_port), resumed)
        before_first_batch = "first micro-batch trained" not in stdout.read_text()
        _, err = resumed.communicate(timeout=300)
    finally:
        if resumed.poll() is None:
            resumed.kill()
            resumed.wait()
    assert resumed.returncode == 0, err[-3000:]
    assert _sample(first_scrape, "streamtrain_train_records_total") == state.extra["trained"]
    assert _sample(first_scrape, "streamtrain_stream_batches_total") == state.last_batch_id + 1
    assert _sample(first_scrape, "streamtrain_eval_heldout_accuracy") == pytest.approx(
        report["final"]["accuracy"]
    )
    # Served during the start-up, with the checkpoint's version (from the checkpoint, or from a
    # parameter server already up on a slow machine: tests/serve/test_process.py tells them apart).
    assert before_first_batch and answered[0] == state.clock, (before_first_batch, answered)
    lines = stdout.read_text()
    # A clean stop leaves no batch saved and uncommitted: Spark starts the next one, planned or not.
    starts = (
        f"Spark starts with batch {state.last_batch_id + 1})",
        f"Spark runs batch {state.last_batch_id + 1} with the offsets it had planned before the "
        "stop)",
    )
    assert any(s in lines for s in starts) and "replays" not in lines, lines[:600]
    final = checkpoint.load(out)
    assert final is not None
    ends = check_ledger(final.ledger)  # no gap, no overlap across the stop
    assert sum(ends.values()) == produced == final.extra["trained"]
    # The closing line: this session's records over this session's time, and the run's total beside
    # them.
    session = json.loads((out / "report.json").read_text())
    assert (
        f"trained {session['trained_this_session']:,} records in {session['train_seconds']:.1f} s"
        f" ({session['records_per_s']:.0f}/s" in lines
    ), lines[-600:]
    assert f", {produced:,} in the whole run;" in lines, lines[-600:]
    assert _litter(temp) == [], _litter(temp)
    shutil.rmtree(temp)


def _litter(temp: Path) -> list[str]:
    """What runs left in ``temp``: anything but their (empty) per-user folder."""
    return sorted(
        str(p.relative_to(temp)) for p in temp.rglob("*") if p.name != f"streamtrain-{os.getuid()}"
    )


def _poll(ask, proc: subprocess.Popen[str], timeout_s: float = 180):  # type: ignore[no-untyped-def]
    """``ask()``'s first answer, asked every 0.1 s while ``proc`` runs."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, f"the run exited ({proc.returncode}) before answering"
        assert time.monotonic() < deadline, f"no answer in {timeout_s} s"
        try:
            return ask()
        except OSError:
            time.sleep(0.1)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()  # type: ignore[no-any-return]


def _predict(port: int) -> tuple[int, float]:
    """The served weights' version and age, from a prediction's headers."""
    body = json.dumps({"instances": [[0.5] * 28]}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/models/higgs:predict",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as r:
        return int(r.headers["X-Model-Version"]), float(r.headers["X-Weights-Age-Seconds"])


def _sample(text: str, name: str) -> float:
    """The value of ``name`` (summed over its labels) in a /metrics page."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and line[len(name)] in " {"
    ]
    assert values, f"no {name} in the first scrape"
    return sum(values)
