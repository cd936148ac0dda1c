"""What people see of a run as it goes, and the figures behind it: start-up milestones, a
status line per trained batch (the held-out split scored when due), the batches' history
and the run's metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.ingest.batch_figures import BatchFigures
from pipeline.jobs.eval_cadence import EvalCadence
from pipeline.jobs.keeping_up import KeepingUp
from pipeline.jobs.rejects import Rejects
from pipeline.jobs.report import History
from pipeline.jobs.run_metrics import RunMetrics
from pipeline.train.drift import Drift
from pipeline.train.rows import BatchRow


class Display:
    """The run's live display.

    Args:
        history: where the batches' rows go.
        metrics: the run's Prometheus figures.
        eval_every: score the held-out split every this many batches.
        eval_share: with a freshness target, the share of the time scoring may take
            (:class:`~pipeline.jobs.eval_cadence.EvalCadence`); None: every ``eval_every``
            batches, whatever it takes.
        clock: monotonic seconds, that scoring is timed and spaced by.
        until_accuracy: the held-out accuracy that ends the run (None: none).
        started: ``time.monotonic()`` when the run started.
        rejects: the run's tally of records set aside (shown in each status line).
        freshness_target_s: the run's ``--freshness-target`` (None: none), against which it
            says when it falls behind (:mod:`~pipeline.jobs.keeping_up`).
        judge_pace: whether to say so (False where the run's own replay sends flat out).
    """

    def __init__(
        self,
        *,
        history: History,
        metrics: RunMetrics,
        eval_every: int,
        eval_share: float | None = None,
        until_accuracy: float | None,
        clock: Callable[[], float] = time.monotonic,
        started: float,
        rejects: Rejects | None = None,
        freshness_target_s: float | None = None,
        judge_pace: bool = True,
    ) -> None:
        self.history, self.metrics = history, metrics
        self.rejects = rejects or Rejects()
        #: A numeric target: the loss the status line shows (its root for a squared error).
        self.regression_loss: str | None = None
        self.until_accuracy, self.started = until_accuracy, started
        self._clock = clock
        self._cadence = EvalCadence(eval_every, max_share=eval_share, clock=clock)
        #: Scores weights on the held-out split (set once the model exists).
        self.evaluation: Any = None
        #: Records trained across resumes (the checkpoint's count).
        self.trained: Callable[[], int] = lambda: 0
        #: Why the run should stop, once a batch says so ("": go on).
        self.stop_reason = ""
        #: The stream's pace against the run's: a line when the run falls behind or catches up.
        self.keeping_up = KeepingUp(target_s=freshness_target_s, judge=judge_pace)

    def stop_requested(self, signal_name: str) -> None:
        """A SIGTERM or Ctrl-C: the run ends after the batch in flight, as at its own end."""
        self.stop_reason = f"{signal_name}: stopped after the batch in flight was committed"
        print(
            f"{signal_name}: stopping after the batch in flight (its checkpoint and commit), then "
            "the model and the report; again to stop at once",
            flush=True,
        )

    def startup(self, what: str) -> None:
        """A start-up milestone (the first run on a machine waits a minute or more here:
        TensorFlow's first import, Spark's first start)."""
        print(f"start-up {time.monotonic() - self.started:5.1f} s: {what}", flush=True)

    def on_drift(self, drifts: list[Drift]) -> None:
        """One line per drift, as it is found (before its batch's status line)."""
        for d in drifts:
            print(d.line(), flush=True)

    def on_row(self, info: BatchFigures, row: BatchRow, weights: np.ndarray) -> None:
        """A batch is saved: score it when due, keep its row, count it and show it."""
        history = self.history
        if history.first_batch_at is None:
            history.first_batch_at = info.started_at
        if history.first_trained_at is None and row.trained:
            history.first_trained_at = time.monotonic()
            self.startup(f"first micro-batch trained ({row.trained:,} records)")
        # A model that has trained nothing has no score worth showing (it is its initial weights').
        if self._cadence.due(history.count) and self.trained() and self.evaluation.can_score:
            began = self._clock()
            row.heldout = self.evaluation.score(weights)
            took = self._clock() - began
            history.eval_s += took
            self._cadence.scored(took_s=took)
        # Streaming time so far, and the part of it spent scoring the held-out split here.
        row.t_stream = round(time.monotonic() - history.first_batch_at, 3)
        row.eval_s_total = round(history.eval_s, 3)
        history.add(row, ended_at=time.monotonic())
        self.metrics.on_batch(info, row)
        self.rejects.add_stream(row.rejected, trained=row.trained)
        elapsed = max(1e-9, time.monotonic() - history.first_batch_at)
        line = row.status(
            total=self.trained(), per_s=history.trained() / elapsed, loss=self.regression_loss
        )
        print(" | ".join(p for p in (line, self.rejects.line()) if p), flush=True)
        pace = self.keeping_up
        said = pace.observe(
            at=self._clock(), rows=row.rows, lag=row.lag, freshness_s=row.freshness_s
        )
        self.metrics.pace.set(needed=pace.needed, has=pace.has, behind=pace.behind)
        if said:
            print(said, flush=True)
        held = (row.heldout or {}).get("accuracy")
        if self.until_accuracy is not None and held is not None and held >= self.until_accuracy:
            self.stop_reason = (
                f"held-out accuracy {held:.4f} reached --until-accuracy {self.until_accuracy}"
            )
