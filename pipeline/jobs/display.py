"""What people see of a run as it goes, and the figures behind it: start-up milestones, a
status line per trained batch (the held-out split scored when due), the batches' history
and the run's metrics."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pipeline.ingest.batch_figures import BatchFigures
from pipeline.jobs.rejects import Rejects
from pipeline.jobs.report import History
from pipeline.jobs.run_metrics import RunMetrics
from pipeline.train.drift import Drift
from pipeline.train.rows import BatchRow

#: With a freshness target, the share of the streaming time held-out scoring may take: its
#: batches are small, and a score every few of them (0.75 s for MNIST's 10,000 records on 2
#: cores, measured at 504a444) took a sixth of the time at 2,000-record batches.
EVAL_SHARE = 0.1


class EvalCadence:
    """When the held-out split is scored: every ``every`` batches; with ``max_share``, a score
    that is due waits until the last one took at most that share of the time since it ended.

    Example (each batch 1 s, a score 0.5 s; at most 10% of the time):
        >>> now = [0.0]
        >>> cadence = EvalCadence(2, max_share=0.1, clock=lambda: now[0])
        >>> due = []
        >>> for batch in range(14):
        ...     now[0] += 1.0
        ...     due.append(cadence.due())
        ...     if due[-1]:
        ...         cadence.scored(took_s=0.5)
        >>> [i for i, d in enumerate(due) if d]
        [1, 6, 11]
        >>> [i for i in range(14) if EvalCadence(2).due_at(i)]
        [1, 3, 5, 7, 9, 11, 13]
    """

    def __init__(
        self,
        every: int,
        *,
        max_share: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every, self.max_share, self._clock = every, max_share, clock
        self._batches = 0  # since the last score
        self._took_s = 0.0  # the last score's time
        self._ended: float | None = None  # when the last score ended

    def due_at(self, count: int) -> bool:
        """Without a share: whether batch ``count`` (0-based, in the run's history) is scored."""
        return (count + 1) % self.every == 0

    def due(self) -> bool:
        """Whether the batch just saved is scored (counts it)."""
        self._batches += 1
        if self._batches < self.every:
            return False
        if self.max_share is None or self._ended is None:
            return True
        return self._took_s <= self.max_share * (self._clock() - self._ended)

    def scored(self, *, took_s: float) -> None:
        """A score took ``took_s``, ending now."""
        self._batches, self._took_s, self._ended = 0, took_s, self._clock()


class Display:
    """The run's live display.

    Args:
        history: where the batches' rows go.
        metrics: the run's Prometheus figures.
        eval_every: score the held-out split every this many batches.
        eval_share: with a freshness target, the share of the time scoring may take
            (:class:`EvalCadence`); None: every ``eval_every`` batches, whatever it takes.
        until_accuracy: the held-out accuracy that ends the run (None: none).
        started: ``time.monotonic()`` when the run started.
        rejects: the run's tally of records set aside (shown in each status line).
    """

    def __init__(
        self,
        *,
        history: History,
        metrics: RunMetrics,
        eval_every: int,
        eval_share: float | None = None,
        until_accuracy: float | None,
        started: float,
        rejects: Rejects | None = None,
    ) -> None:
        self.history, self.metrics = history, metrics
        self.rejects = rejects or Rejects()
        #: A numeric target: the loss the status line shows (its root for a squared error).
        self.regression_loss: str | None = None
        self.eval_every, self.until_accuracy, self.started = eval_every, until_accuracy, started
        self._cadence = EvalCadence(eval_every, max_share=eval_share)
        #: Scores weights on the held-out split (set once the model exists).
        self.evaluation: Any = None
        #: Records trained across resumes (the checkpoint's count).
        self.trained: Callable[[], int] = lambda: 0
        #: Why the run should stop, once a batch says so ("": go on).
        self.stop_reason = ""

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
        cadence = self._cadence
        due = cadence.due_at(history.count) if cadence.max_share is None else cadence.due()
        if due and self.trained() and self.evaluation.can_score:
            began = time.monotonic()
            row.heldout = self.evaluation.score(weights)
            took = time.monotonic() - began
            history.eval_s += took
            cadence.scored(took_s=took)
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
        held = (row.heldout or {}).get("accuracy")
        if self.until_accuracy is not None and held is not None and held >= self.until_accuracy:
            self.stop_reason = (
                f"held-out accuracy {held:.4f} reached --until-accuracy {self.until_accuracy}"
            )
