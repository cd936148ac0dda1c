"""The run's report picture, drawn from a run's rows (no Spark needed)."""

from __future__ import annotations

from pathlib import Path

from pipeline.observe.report_plot import report_plots


def _rows(n: int, heldout_at: tuple[int, ...] = ()) -> list[dict]:  # type: ignore[type-arg]
    rows = []
    for i in range(n):
        row = {"batch_id": i, "t": i + 1.0, "t_stream": i + 1.0, "trained": 1000, "lag": 10 * i,
               "staleness_p50": 1.0, "staleness_p99": 1.0, "prequential_accuracy": 0.5 + i / 10}
        if i in heldout_at:
            row["heldout"] = {"accuracy": 0.6 + i / 10}
        rows.append(row)
    return rows


def test_a_short_run_shows_its_final_held_out_score(tmp_path: Path) -> None:
    """Proves: a 3-batch run scored only at its end (every 5 batches) still draws held-out accuracy."""
    drawn = report_plots(_rows(3), tmp_path / "r.png", final=0.97, eval_every=5, eval_records=10_000)
    assert drawn["held-out"] == 1 and drawn["prequential"] == 3
    assert (tmp_path / "r.png").stat().st_size > 10_000


def test_the_final_score_is_not_drawn_twice(tmp_path: Path) -> None:
    rows = _rows(5, heldout_at=(4,))
    drawn = report_plots(rows, tmp_path / "r.png", final=rows[-1]["heldout"]["accuracy"], eval_every=5)
    assert drawn["held-out"] == 1
    assert report_plots(_rows(6, heldout_at=(4,)), tmp_path / "s.png", final=0.99, eval_every=5)["held-out"] == 2
