"""The run's report picture, drawn from a run's rows (no Spark needed)."""

from __future__ import annotations

from pathlib import Path

from pipeline.observe.report_plot import accuracy_limits, count_label, report_plots


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


def test_the_accuracy_axis_spreads_a_trained_models_scores() -> None:
    """Proves: 0.97-0.99 held-out scores fill the accuracy axis instead of its top 3 %
    (a 0-1 axis put them under the legend), the first near-chance batches left out."""
    prequential = [0.1, 0.4, 0.8, 0.95, *[0.97 + 0.02 * (i % 3) / 2 for i in range(40)]]
    low, high = accuracy_limits(prequential, [0.972, 0.981, 0.989])
    assert 0.94 <= low < 0.97 and 0.99 < high <= 1.0
    assert (0.99 - 0.97) / (high - low) > 0.5  # the scores span most of the axis
    assert accuracy_limits([0.5], []) == (0.495, 0.505) and accuracy_limits([], []) == (0.0, 1.0)
    assert accuracy_limits([float("nan")], [0.2])[0] < 0.2


def test_counts_carry_their_scale_on_the_tick() -> None:
    """Proves: the lag axis reads 1.07M on the tick, not 1.07 under a '1e6' offset."""
    assert [count_label(v) for v in (0, 999, 1_000, 250_000, 1_070_000)] == ["0", "999", "1k", "250k", "1.07M"]
