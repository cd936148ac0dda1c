"""The run's display and its start-up figure (issue 29): `report.json`'s `startup_s` is what the
performance guide calls start-up, from the launch to the first trained batch."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from pipeline.ingest.batch_figures import BatchFigures
from pipeline.jobs.display import Display
from pipeline.jobs.report import History
from pipeline.jobs.run_metrics import RunMetrics
from pipeline.observe.metrics.pace import PaceMeters
from pipeline.train.rows import BatchRow


class _Metrics:
    def __init__(self) -> None:
        self.pace = PaceMeters(CollectorRegistry())

    def on_batch(self, info: Any, row: Any) -> None:
        pass


def test_startup_ends_when_the_first_batch_is_trained_not_when_it_reached_the_driver() -> None:
    launched = time.monotonic() - 10.0
    history = History()
    display = Display(
        history=history,
        metrics=_Metrics(),
        eval_every=1000,
        until_accuracy=None,  # type: ignore[arg-type]
        started=launched,
    )
    assert history.startup_s(launched) is None  # no batch trained yet
    # The batch reached the driver 4 s after the launch (as the workers finished warming up)
    # and was trained by now, 10 s after it.
    first = BatchFigures(batch_id=0, ranges=[], rows=10, started_at=launched + 4.0)
    display.on_row(
        first,
        BatchRow(0, 10.0, 10, 10, {}, 6.0, 0, None, None, 1, 5.0, 0.1),
        np.zeros(1, np.float32),
    )
    startup = history.startup_s(launched)
    assert startup is not None and 10.0 <= startup < 11.0
    display.on_row(
        BatchFigures(batch_id=1, ranges=[], rows=10, started_at=launched + 11.0),
        BatchRow(1, 12.0, 10, 10, {}, 1.0, 0, None, None, 2, 0.9, 0.1),
        np.zeros(1, np.float32),
    )
    assert history.startup_s(launched) == startup  # the first batch's, once


class _Evaluation:
    can_score = True

    def __init__(self) -> None:
        self.scored = 0

    def score(self, weights: Any) -> dict[str, float]:
        self.scored += 1
        return {"accuracy": 0.5432}


def test_a_batch_that_trained_nothing_shows_no_first_batch_and_no_score(capsys: Any) -> None:
    """Proves (issue 41, item 2): every record rejected, so 0 trained: no "first micro-batch
    trained", no held-out score (the initial weights' would read as the model's), the rejects
    and their reason in the status line, and a last line that says nothing was scored."""
    from pipeline.jobs.rejects import Rejects
    from pipeline.jobs.report import RunReport

    history, evaluation = History(), _Evaluation()
    display = Display(
        history=history,
        metrics=_Metrics(),
        eval_every=1,
        until_accuracy=None,  # type: ignore[arg-type]
        started=time.monotonic(),
        rejects=Rejects(),
    )
    display.evaluation = evaluation
    row = BatchRow(0, 1.0, 500, 0, {"not_avro": 500}, 1.0, 0, None, None, 0, 0.0, 0.0)
    display.on_row(
        BatchFigures(batch_id=0, ranges=[], rows=500, started_at=time.monotonic()),
        row,
        np.zeros(1, np.float32),
    )
    out = capsys.readouterr().out
    assert "first micro-batch trained" not in out and evaluation.scored == 0 and row.heldout is None
    assert "rejected 500 (100%: not_avro 500)" in out, out
    report = RunReport(
        {},
        {},
        "t",
        "o",
        1.0,
        0,
        0,
        500,
        0.0,
        0.0,
        0.0,
        "done",
        {},
        [],
        [],
        {},
        {},
        rejected=display.rejects.to_dict(),
    )
    assert (
        "no held-out score (nothing trained)" in report.summary()
        and "rejected 500 (not_avro 500)" in report.summary()
    )


def test_a_numeric_targets_status_line_shows_its_rmse(capsys: Any) -> None:
    """Proves (issue 41, item 4): a regression's status line shows the prequential RMSE, not
    `prequential acc nan`."""
    display = Display(
        history=History(),
        metrics=_Metrics(),
        eval_every=1000,
        until_accuracy=None,  # type: ignore[arg-type]
        started=time.monotonic(),
    )
    display.regression_loss = "mean_squared_error"
    row = BatchRow(0, 1.0, 10, 10, {}, 1.0, 0, None, None, 1, 0.1, 0.0, float("nan"), 640_000.0)
    display.on_row(
        BatchFigures(batch_id=0, ranges=[], rows=10, started_at=time.monotonic()),
        row,
        np.zeros(1, np.float32),
    )
    out = capsys.readouterr().out
    assert "prequential rmse 800" in out and "acc" not in out, out


def test_with_a_freshness_target_scoring_takes_at_most_its_share_of_the_time() -> None:
    """Issue 44: a freshness target's small batches made a score every few of them a sixth of
    the run's time. Batches of 0.15 s, a score of 0.5 s, at most 10% of the time: after the
    first score, the next waits until 5 s have passed since it ended."""
    now = [0.0]

    class _Timed(_Evaluation):
        def score(self, weights: Any) -> dict[str, float]:
            now[0] += 0.5  # what a score takes, on the display's clock
            return super().score(weights)

    history, evaluation = History(), _Timed()
    display = Display(
        history=history,
        metrics=_Metrics(),
        eval_every=1,
        eval_share=0.1,
        until_accuracy=None,  # type: ignore[arg-type]
        started=time.monotonic(),
        clock=lambda: now[0],
    )
    display.evaluation = evaluation
    display.trained = lambda: 10
    scored_at = []
    for i in range(100):
        now[0] += 0.15
        before = evaluation.scored
        display.on_row(
            BatchFigures(batch_id=i, ranges=[], rows=10, started_at=time.monotonic()),
            BatchRow(i, 1.0, 10, 10, {}, 0.01, 0, None, None, i, 0.01, 0.0),
            np.zeros(1, np.float32),
        )
        if evaluation.scored > before:
            scored_at.append(i)
    # The first batch, then the first batch 5 s or more after each score: 34 batches on.
    assert scored_at == [0, 34, 68], scored_at


def test_a_run_that_cannot_keep_up_says_so_once_on_metrics_too_and_once_when_it_catches_up(
    capsys: Any,
) -> None:
    """Proves (issue 57, item 3): batches that read 500 records/s while the lag grows by
    2,000/s, the model staler than its 2 s target, give one "falling behind" line with both
    rates, and /metrics's gauges say the same (StreamtrainFallingBehind fires on them); a
    lag that shrinks again gives one "keeping up again" line and the gauge back at 0. A burst
    whose model stays within the target says nothing, nor does one slow batch, nor a run whose
    own replay sends flat out."""
    now = [0.0]

    def display(**kw: Any) -> tuple[Display, RunMetrics]:
        metrics = RunMetrics(dataset="higgs", algorithm="adag", topic="t", workers=2)
        d = Display(
            history=History(),
            metrics=metrics,
            eval_every=1000,
            until_accuracy=None,
            started=time.monotonic(),
            clock=lambda: now[0],
            **kw,
        )
        d.evaluation = _Evaluation()
        return d, metrics

    def batch(d: Display, i: int, rows: int, lag: int, freshness_s: float) -> None:
        now[0] = 1_000.0 + 2.0 * i
        row = BatchRow(i, 2.0 * i, rows, rows, {}, 1.5, lag, None, None, i, 1.0, 0.1)
        row.freshness_s = freshness_s
        d.on_row(BatchFigures(batch_id=i, ranges=[], rows=rows), row, np.zeros(1))

    shown, metrics = display(freshness_target_s=2.0)
    gauge = metrics.meters.registry.get_sample_value
    for i in range(30):  # a burst within the target: the lag grows, the model stays fresh
        batch(shown, i, 1_000, 4_000 * i, freshness_s=1.5)
    assert "falling behind" not in capsys.readouterr().out
    assert gauge("streamtrain_train_falling_behind") == 0
    for i in range(30, 60):  # past the target, still behind
        batch(shown, i, 1_000, 4_000 * i, freshness_s=float(i))
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if line.startswith("falling behind")]
    assert said == [
        "falling behind: the stream brings 2,500 records/s and the run trains 500/s; the lag of "
        "120,000 records grows by 2,000/s. Add workers (--workers) or cores, or shorten the "
        "model, to keep up."
    ], out
    assert gauge("streamtrain_train_falling_behind") == 1
    assert gauge("streamtrain_stream_arrival_records_per_second") == 2_500
    assert gauge("streamtrain_train_pace_records_per_second") == 500
    for i in range(60, 90):  # 4,000 a batch read, the lag shrinking by 1,000 a batch
        batch(shown, i, 4_000, 236_000 - 1_000 * (i - 59), freshness_s=float(i))
    out = capsys.readouterr().out
    again = [line for line in out.splitlines() if line.startswith("keeping up again")]
    assert len(again) == 1 and "falling behind" not in out, out
    assert gauge("streamtrain_train_falling_behind") == 0
    # Keeping up, but one batch slow (a retry): its lag is no trend.
    steady, _ = display()
    for i in range(40):
        batch(steady, i, 1_000, 1_000 + (6_000 if i == 25 else 0), freshness_s=3.0)
    # The run's own replay, flat out: behind by design, nothing said.
    flat_out, _ = display(judge_pace=False)
    for i in range(40):
        batch(flat_out, i, 1_000, 4_000 * i, freshness_s=float(i))
    assert "falling behind" not in capsys.readouterr().out
