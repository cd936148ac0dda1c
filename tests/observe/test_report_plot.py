"""The run's report picture, drawn from a run's rows (no Spark needed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipeline.observe.report_plot import accuracy_limits, count_label, report_plots


def _rows(n: int, heldout_at: tuple[int, ...] = ()) -> list[dict]:  # type: ignore[type-arg]
    rows = []
    for i in range(n):
        row = {
            "batch_id": i,
            "t": i + 1.0,
            "t_stream": i + 1.0,
            "trained": 1000,
            "lag": 10 * i,
            "staleness_p50": 1.0,
            "staleness_p99": 1.0,
            "prequential_accuracy": 0.5 + i / 10,
        }
        if i in heldout_at:
            row["heldout"] = {"accuracy": 0.6 + i / 10}
        rows.append(row)
    return rows


def test_a_short_run_shows_its_final_held_out_score(tmp_path: Path) -> None:
    """Proves: a 3-batch run scored only at its end (every 5 batches) still draws held-out
    accuracy."""
    drawn = report_plots(
        _rows(3), tmp_path / "r.png", final=0.97, eval_every=5, eval_records=10_000
    )
    assert drawn["held-out"] == 1 and drawn["prequential"] == 3
    assert (tmp_path / "r.png").stat().st_size > 10_000


def test_the_final_score_is_not_drawn_twice(tmp_path: Path) -> None:
    rows = _rows(5, heldout_at=(4,))
    drawn = report_plots(
        rows, tmp_path / "r.png", final=rows[-1]["heldout"]["accuracy"], eval_every=5
    )
    assert drawn["held-out"] == 1
    assert (
        report_plots(_rows(6, heldout_at=(4,)), tmp_path / "s.png", final=0.99, eval_every=5)[
            "held-out"
        ]
        == 2
    )


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
    assert [count_label(v) for v in (0, 999, 1_000, 250_000, 1_070_000)] == [
        "0",
        "999",
        "1k",
        "250k",
        "1.07M",
    ]


def _session(
    first: int,
    n: int,
    *,
    began_at: float,
    every_s: float = 2.0,
    idle_after: int | None = None,
    idle_s: float = 0.0,
    lag: int = 0,
) -> list[dict]:  # type: ignore[type-arg]
    """``n`` rows of one trainer process from batch ``first``: a batch every ``every_s``
    seconds, from ``began_at`` (Unix time), with ``idle_s`` of idle stream after row
    ``idle_after``."""
    rows, t = [], 3.0  # the process's own clock: its start-up took 3 s
    for i in range(n):
        t += every_s + (idle_s if idle_after is not None and i == idle_after + 1 else 0.0)
        rows.append(
            {
                "batch_id": first + i,
                "t": t,
                "t_stream": t - 3.0,
                "at": began_at + t,
                "batch_s": 1.5,
                "trained": 1000,
                "lag": lag,
                "staleness_p50": 1.0,
                "staleness_p99": 1.0,
                "prequential_accuracy": 0.9,
            }
        )
    return rows


def test_the_picture_covers_every_session_and_leaves_gaps_as_gaps(tmp_path: Path) -> None:
    """Proves: report.png draws a run of two sessions (a stop and a resume, with a
    5-minute idle stream in the second) on one clock: all rows of both, the resume
    marked, the idle gap shaded and crossed by no line (the lag stays 0 before and after
    it, and no line draws a decline across it), and the throughput after a break counts
    the batch's own time, not the gap's."""
    first = _session(0, 20, began_at=1_000_000.0)
    stop_s = first[-1]["at"]
    second = _session(20, 20, began_at=stop_s + 60.0, idle_after=9, idle_s=300.0, lag=5)
    drawn = report_plots(first + second, tmp_path / "r.png", final=0.9, eval_every=5)
    assert drawn["throughput"] == drawn["lag"] == 40 and drawn["sessions"] == 2
    # x: seconds since the first batch began (its end minus its duration), on one clock.
    origin = first[0]["at"] - 1.5
    assert drawn["span_s"] == pytest.approx(second[-1]["at"] - origin)
    ((idle_from, idle_to),) = drawn["idle"]
    assert idle_from == pytest.approx(second[9]["at"] - origin) and idle_to == pytest.approx(
        second[10]["at"] - 1.5 - origin
    )
    lag_x, lag_y = drawn["lines"]["lag"]
    # A NaN between the two sessions and one inside the idle gap: the line stops at each.
    breaks = [
        float(x)
        for x, prev in zip(lag_x[1:], lag_x[:-1], strict=True)
        if np.isnan(x) and not np.isnan(prev)
    ]
    assert len(breaks) == 2 and int(np.isnan(lag_y).sum()) == 2
    thr_x, thr_y = drawn["lines"]["per batch"]
    finite = thr_y[~np.isnan(thr_y)]
    assert finite.min() == pytest.approx(
        1000 / 2.0
    )  # 2 s per batch everywhere; never 1000 records over a 5-minute gap
    assert finite.max() == pytest.approx(1000 / 1.5)  # a batch after a break: its own 1.5 s


def test_each_drift_is_marked_where_it_was_found(tmp_path: Path) -> None:
    """Proves (issue 45): report.png draws one mark per drift the rows list, none without."""
    rows = _rows(6)
    rows[3]["drifts"] = [{"signal": "loss", "batch_id": 3}, {"signal": "prior", "batch_id": 3}]
    assert report_plots(rows, tmp_path / "r.png", eval_every=5)["drifts"] == 2
    assert report_plots(_rows(6), tmp_path / "s.png", eval_every=5)["drifts"] == 0
