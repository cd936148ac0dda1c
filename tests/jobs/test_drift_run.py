"""Drift through a whole run (issue 45): a table whose concept flips halfway, replayed through
the embedded broker into Spark and the parameter server, with ``--on-drift adapt``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.train import checkpoint

ROOT = Path(__file__).resolve().parents[2]
CHANGE, RECORDS, BATCH = 6_000, 12_000, 1_000


def _table(path: Path, n: int, *, change: int | None, seed: int) -> None:
    """``n`` rows of two uniform features; the label says whether x1 > x2, and from row
    ``change`` on the opposite (the features and the class prior stay as they were)."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, 2))
    above = x[:, 0] > x[:, 1]
    if change is not None:
        above[change:] = ~above[change:]
    with open(path, "w") as f:
        for (a, b), label in zip(x.tolist(), above.tolist(), strict=True):
            f.write(json.dumps({"x1": a, "x2": b, "label": "above" if label else "below"}) + "\n")


@pytest.mark.slow  # a run
@pytest.mark.parametrize("source", ["python", "jvm"])
def test_a_flipped_concept_is_found_said_and_adapted_to(tmp_path: Path, source: str) -> None:
    """Proves: the loss signal finds the planted change within two batches of it, and only
    that signal (features and class prior did not move); the run says it in one line and
    lists it in report.json with its batch, offsets per partition and statistic; the
    checkpoint from before it is kept; records are held out of training from then on, and
    the final held-out score is on them: the adapted model scores well on the new concept,
    where the evaluation file (the old concept) would score it near 0. ``adapt``'s batches
    after the drift train each record ``adapt_passes`` (4) times, and count it once; the
    drift's own batch is trained again ``adapt_replay`` (8) times over before its save (the
    server's clock moves that much more in it), each record once in the ledger still;
    report.json says what was done. Through both Kafka sources: Spark's own replays the batch
    by computing its DataFrame again.

    Slow: per source, one whole run (its own Apache Kafka broker and replay, Spark, the
    parameter server, TensorFlow workers) of the 12,000-record table in 1,000-record batches to
    its end, the drift's batch trained 8 more times and each later batch 4 times; the old
    concept's half warms the detector up and the new concept's half is adapted to and scored on."""
    _table(tmp_path / "flip.jsonl", RECORDS, change=CHANGE, seed=1)
    _table(tmp_path / "old.jsonl", 1_000, change=None, seed=2)
    out = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            "--data",
            str(tmp_path / "flip.jsonl"),
            "--label",
            "label",
            "--eval-data",
            str(tmp_path / "old.jsonl"),
            "--out",
            str(out),
            "--on-drift",
            "adapt",
            "--seed",
            "1",
            "--max-offsets-per-trigger",
            str(BATCH),
            "--eval-every",
            "2",
            "--drift",
            "warmup=2000,cooldown=4000",
            "--source",
            source,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["stopped_because"] == "all produced records trained"
    assert report["settings"]["source"] == source
    drifts = report["drifts"]
    assert [d["signal"] for d in drifts] == ["loss"], drifts
    [d] = drifts
    assert CHANGE - BATCH <= d["records"] <= CHANGE + BATCH, d
    assert d["statistic"] > 1.0 and sorted(d["offsets"]) == [
        f"{report['topic']}:0",
        f"{report['topic']}:1",
    ]
    lines = [line for line in done.stdout.splitlines() if line.startswith("drift at batch")]
    assert (
        len(lines) == 1 and f"drift at batch {d['batch_id']} " in lines[0] and "loss" in lines[0]
    ), lines
    assert (
        checkpoint.generation_path(out, d["generation"]).is_file()
        and d["generation"] == d["batch_id"] - 1
    )
    rows = [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines()]
    after = [r for r in rows if r["batch_id"] > d["batch_id"]]
    assert after and all(r.get("held_out", 0) > 0 for r in after)
    assert not any(r.get("held_out") for r in rows if r["batch_id"] <= d["batch_id"])

    def steps_per_record(row: dict) -> float:  # type: ignore[type-arg]
        return sum(t["steps"] for t in row["tasks"]) / max(1, row["trained"])

    by_id = {r["batch_id"]: r for r in rows}
    assert steps_per_record(after[0]) > 3 * steps_per_record(by_id[d["batch_id"]]), after[0]
    reaction = d["reaction"]
    assert reaction["mode"] == "adapt" and reaction["replay_passes"] == 8, reaction
    # Its records but those held out from the drift on (one in 20), from both partitions.
    assert 0.9 * BATCH <= reaction["replayed"] < BATCH, reaction

    def moved(batch_id: int) -> int:  # the server's clock over a batch
        return by_id[batch_id]["clock"] - by_id[batch_id - 1]["clock"]

    assert moved(d["batch_id"]) > 6 * moved(d["batch_id"] - 1), [
        moved(b) for b in sorted(by_id)[1:]
    ]
    # Every record handled once: trained, or held out to score the model after the drift.
    assert report["trained_records"] + sum(r.get("held_out", 0) for r in rows) == RECORDS
    assert report["final"]["accuracy"] > 0.8, report["final"]
    assert report["plots"] and (out / "report.png").is_file()
