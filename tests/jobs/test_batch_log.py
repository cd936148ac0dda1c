"""batches.jsonl stays bounded: a year of batches through a run's History keeps the folder
small, the run whole (its first and last batches, its totals) and its picture drawable."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipeline.jobs import batch_log
from pipeline.jobs.report import History
from pipeline.observe.timeline import timeline
from pipeline.train.rows import BatchRow, TaskRow


def _row(i: int) -> BatchRow:
    task = TaskRow(
        worker=0, records=245, steps=4, applied=4, skipped=0, repeats=0, attempt=0,
        transport="shared memory",
    )  # fmt: skip
    return BatchRow(
        batch_id=i,
        t=300.0 * i,
        rows=500,
        trained=490,
        rejected={"wrong_length": 10},
        batch_s=2.0,
        lag=0,
        staleness_p50=0.0,
        staleness_p99=1.0,
        clock=4 * i,
        compute_s=1.0,
        exchange_s=0.5,
        prequential_accuracy=0.9,
        heldout={"accuracy": 0.9} if i % 100 == 0 else None,
        at=1.7e9 + 300.0 * i,
        tasks=[task, task],
    )


@pytest.mark.slow  # a year of rows: some 20 s
def test_a_year_of_batches_keeps_the_run_whole_in_a_bounded_file(tmp_path: Path) -> None:
    """Proves: a batch every five minutes for a year (105,120 rows) leaves a file within its
    bound (scaled down here to 2 MB: the rows would make some 60 MB), starting at the
    run's first batch and ending at its last, its records trained and rejected the year's,
    and the report's timeline still reads it."""
    path = tmp_path / "batches.jsonl"
    history = History(path=path, max_bytes=2 << 20)
    year = 365 * 24 * 12
    started = time.monotonic()
    for i in range(year):
        history.add(_row(i), ended_at=float(i))
    took = time.monotonic() - started
    assert path.stat().st_size <= 2 << 20
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batches.jsonl"]  # no .tmp left
    rows = batch_log.read_all(path)
    assert rows[0]["batch_id"] == 0 and rows[-1]["batch_id"] == year - 1
    assert sum(r.get("batches", 1) for r in rows) == year
    assert sum(r["trained"] for r in rows) == 490 * year
    assert sum(r["rejected"]["wrong_length"] for r in rows) == 10 * year
    assert [r["batch_id"] for r in rows] == sorted(r["batch_id"] for r in rows)
    assert "tasks" in rows[-1] and len(rows) < year // 10
    tl = timeline(rows)
    assert tl.x[-1] == pytest.approx(300.0 * (year - 1) + 2.0) and not tl.sessions
    assert took < 120, f"{took:.0f} s to append a year of rows"
