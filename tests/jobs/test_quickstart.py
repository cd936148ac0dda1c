"""The README's quickstart, read from its block (tests/docblocks.py): the first command runs the
main job on its embedded default, end to end (real broker, Spark, parameter server and
TensorFlow; the one run every check of a plain run reads), and the second is CI's."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.train.ledger import check_ledger
from producers import datasets
from tests import docblocks

ROOT = Path(__file__).resolve().parents[2]


def _quickstart_run() -> list[str]:
    """The arguments the quickstart gives `streamtrain run`, after it installs into .venv."""
    install, tests = docblocks.commands(docblocks.run_block("README.md", __file__))
    assert (
        tests == "bash tests/run.sh" and tests in (ROOT / ".ci" / "run").read_text()
    )  # CI runs exactly this
    *steps, run = install.split(" && ")
    assert steps == ["python3 -m venv .venv", ".venv/bin/pip install -e ."], steps
    argv = shlex.split(run)
    assert argv[:2] == [".venv/bin/streamtrain", "run"], argv
    return argv[2:]


def test_the_quickstart_installs_then_runs_and_ci_runs_its_test_command() -> None:
    assert _quickstart_run() == []  # the embedded default: no option at all


@pytest.mark.slow  # one epoch of MNIST
def test_streamtrain_run_on_its_embedded_default(tmp_path: Path) -> None:
    """Proves: the quickstart's bare `streamtrain run` trains one pass of MNIST above 95%
    held-out accuracy, every record once by the ledger, through shared memory, with no drift
    found and its start-up shown in order.

    Slow: one epoch of MNIST (60,000 records, batches of up to 20,000) through dist-keras's
    1M-weight CNN, after the run's own Apache Kafka broker and replay start, on a first run for
    the JVM (no class archive); it is the README's command exactly, so nothing can be shortened."""
    # Exactly the quickstart's `streamtrain run`, with the output folder kept out of the tree,
    # and a cache with MNIST but no class archive: the run is a first run for the JVM.
    args = _quickstart_run()
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "mnist.npz").symlink_to(datasets.mnist.fetch())
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env={**os.environ, "STREAMTRAIN_CACHE_DIR": str(cache)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    accuracy = float(
        re.search(r"held-out accuracy (\d\.\d+)", done.stdout.splitlines()[-2]).group(1)
    )  # type: ignore[union-attr]
    assert accuracy > 0.95  # one pass of MNIST through dist-keras's CNN
    [path] = list((tmp_path / "runs").glob("mnist-*/report.json"))
    report = json.loads(path.read_text())
    assert (path.parent / "model.keras").is_file()
    assert report["final"]["accuracy"] == pytest.approx(accuracy, abs=1e-4)
    batches = report["batches"]
    assert [b["batch_id"] for b in batches] == list(range(len(batches)))
    assert all(b["rows"] <= 20_000 for b in batches)  # the default --max-offsets-per-trigger
    # The report agrees with the ledger: every trained record is in exactly one range.
    ledger = report["ledger"]
    check_ledger(ledger)
    assert report["trained_records"] == 60_000 == sum(end - start for *_, start, end in ledger)
    assert report["trained_records"] == sum(b["trained"] for b in batches)
    assert "prequential_accuracy" in batches[0] and report["startup_s"] > 0
    # A stationary stream (issue 45): no drift found, none said, no record held out.
    assert report["drifts"] == [] and "drift at batch" not in done.stdout
    assert not any(b.get("held_out") or b.get("drifts") for b in batches)
    assert "held-out accuracy" in done.stdout and f"batch {len(batches) - 1:4d} |" in done.stdout
    # Start-up shows its progress on the live display, in order, before the first batch's line.
    steps = [
        line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("start-up ")
    ]
    assert [s.split(" ")[0] for s in steps] == [
        "mnist",
        "Kafka",
        "Spark",
        "model",
        "workers",
        "first",
    ], steps
    assert done.stdout.index("first micro-batch") < done.stdout.index("batch    0 |")
    # In local mode every partition's worker exchanged through shared memory, one
    # connection per partition and batch, and the server refused nothing.
    tasks = [t for b in batches for t in b["tasks"]]
    assert tasks and {t["transport"] for t in tasks} == {"shared memory"}
    assert report["parameter_server"]["shared_memory"] == len(tasks), report["parameter_server"]
    assert report["parameter_server"]["refused"] == {}
    # Spark's warnings that a clean run has nothing to act on are kept quiet.
    assert (
        "ResolveWriteToStream" not in done.stderr
        and "Failed to cancel job group" not in done.stderr
    )
    # The classes the JVM loaded went to the background build of the archive for later runs.
    assert list((cache / "jvm").glob("*.log")), sorted(p.name for p in (cache / "jvm").iterdir())
