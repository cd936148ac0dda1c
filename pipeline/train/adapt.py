"""What a run does when its stream drifts (``--on-drift alert|adapt``).

In either mode, from the first drift on:

- the held-out split no longer describes the stream, so the held-out score moves to a
  window of records *after* the drift: one record in :data:`HOLDOUT_EVERY` (by offset, so a
  retried task sets aside the same ones) is held out of training and kept, the newest
  ``window`` of them scored; until :data:`MIN_WINDOW` are in, no held-out score is given;
- the collapse check (:class:`~pipeline.train.divergence.HeldoutWatch`) starts afresh on
  that window: a score that fell because the concept changed is not a model that diverged;
- the checkpoint generation from just before the drift is kept, for a way back.

With ``adapt``, the micro-batch the drift showed up in (the only records of the new concept
there are yet) is trained again ``adapt_replay`` times over, at once: its tasks run again
on the same offsets, as tasks of their own for the parameter server, before the batch's
checkpoint is saved, so that a driver killed during the replay trains the whole batch
again on resuming, and none of it twice. Then, for the ``adapt_records`` records after
the drift, the learning rate is raised to ``adapt_lr_scale`` times the configured one (the
server's optimizer's under synchronous SGD, and every replica's own under the other
algorithms; the replay trains at it too), and each task trains its records
``adapt_passes`` times (their prequential score is the first pass's); then as configured
again. Each drift's ``reaction`` says what was done. Measured against resetting the
optimizer's moments, and raises, passes and replays of other sizes: ``docs/drift.md``.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pipeline.train.divergence import HeldoutWatch
from pipeline.train.drift import Drift, DriftWatch, offsets_of

#: One record in this many (by Kafka offset) is held out of training after a drift.
HOLDOUT_EVERY = 20
#: Post-drift held-out records below which no held-out score is given.
MIN_WINDOW = 200
#: The modes of ``--on-drift``.
MODES = ("alert", "adapt")


class DriftResponse:
    """The run's drift signals and its reaction to them, one batch at a time (on the driver).

    Args:
        watch: the signals.
        mode: one of :data:`MODES`.
        handler: the run's :class:`~pipeline.train.handler.TrainHandler` (it travels to the
            executors with each batch: what is set on it here reaches the next batch's tasks).
        batch_size: the records of a mini-batch (what each prequential loss is a mean over).
        window: the post-drift held-out records kept (the newest).
        on_drift: called with each batch's drifts (the metrics, the status line).
    """

    def __init__(
        self,
        watch: DriftWatch,
        mode: str,
        *,
        handler: Any,
        batch_size: int,
        window: int = 2_000,
        on_drift: Callable[[list[Drift]], None] | None = None,
        algorithm: Any = None,
    ) -> None:
        self.watch, self.mode, self.handler, self.window = watch, mode, handler, window
        self.batch_size, self.on_drift = batch_size, on_drift
        #: Whose optimizer's rate is raised beside the replicas': the algorithm whose server half
        #: runs in this process, or the sharded server (each shard's).
        self.algorithm = algorithm
        self._boost_left = 0  # records still to train with the raised rate
        self._lr_scale = 1.0  # the scale in force
        #: Scores the held-out records (set once the run has one); its split is replaced.
        self.evaluation: Any = None
        #: Whether the run checks its held-out score for a collapse.
        self.check_collapse = False
        self.regression = False
        self._x: collections.deque[np.ndarray] = collections.deque()
        self._y: collections.deque[np.ndarray] = collections.deque()
        self._held = 0
        self._armed = False  # whether the collapse check runs on the post-drift window

    def pinned(self) -> list[int]:
        """The checkpoint generations from just before each drift (kept for a way back)."""
        return sorted({d.generation for d in self.watch.found if d.generation >= 0})

    def on_batch(self, info: Any, row: Any, driver: Any) -> list[Any]:
        """Before the batch is saved: its drifts (on ``row.drifts``), the reaction, and the
        records its tasks held out (``row.held_out``; the held-out split when enough).
        Returns the task results of the batch's replay (empty: none), for the driver to
        check against the server before it saves the center they trained."""
        drifts = self.watch.observe(
            info.batch_id, info.results, offsets_of(info.ranges), batch_size=self.batch_size
        )
        for d in drifts:
            d.generation = driver.state.last_batch_id if driver.state is not None else -1
        row.drifts = list(drifts)
        self._wind_down(row.trained)
        replayed: list[Any] = []
        if drifts:
            self._restart(driver)
            reaction: dict[str, Any] = {"mode": self.mode}
            if self.mode == "adapt":
                s = self.watch.settings
                reaction.update(
                    lr_scale=s.adapt_lr_scale, passes=s.adapt_passes, records=s.adapt_records
                )
                if s.adapt_replay and info.again is not None:
                    began = time.perf_counter()
                    replayed = self._replay(info.again, s.adapt_replay)
                    reaction.update(
                        replay_passes=s.adapt_replay,
                        replayed=sum(r.records for r in replayed),
                        replay_s=round(time.perf_counter() - began, 2),
                    )
            for d in drifts:
                d.reaction = dict(reaction)
            if self.on_drift is not None:
                self.on_drift(drifts)
        row.held_out = self._collect(info.results)
        window = self._records() if row.held_out else None
        if window is not None and self.evaluation is not None:
            self.evaluation.use(*window)
            if self.check_collapse and not self._armed:  # re-armed on the new concept
                driver.watch = HeldoutWatch.for_labels(window[1], regression=self.regression)
                self._armed = True
        return replayed

    def state(self) -> dict[str, float]:
        """What the checkpoint keeps of the reaction: the learning rate's scale and the passes
        in force, and the records the reaction has left."""
        return {
            "lr_scale": self._lr_scale,
            "boost_left": self._boost_left,
            "passes": self.handler.passes,
        }

    def resumed(self, driver: Any, state: dict[str, float] | None = None) -> None:
        """A resumed run that had drifted: held-out records after the drift again (the
        window, kept in memory, starts empty), and the raise :meth:`state` kept goes on for
        the records it had left, instead of the configured rate from the restart on."""
        self._restart(driver, adapt=False)
        kept = state or {}
        left = int(kept.get("boost_left", 0))
        if self.mode == "adapt" and left > 0:
            self._boost_left = left
            self._react(float(kept.get("lr_scale", 1.0)), int(kept.get("passes", 1)))

    def _restart(self, driver: Any, *, adapt: bool = True) -> None:
        """A drift: the held-out window starts again after it; ``adapt`` raises the learning rate
        for a while."""
        self.handler.holdout_every = HOLDOUT_EVERY
        self._x.clear()
        self._y.clear()
        self._held = 0
        if self.evaluation is not None:
            self.evaluation.suspend()  # the split before the drift says nothing of the model now
        if driver.watch is not None or self._armed:
            self.check_collapse = True
        driver.watch, self._armed = None, False
        if adapt and self.mode == "adapt":
            self._boost_left = self.watch.settings.adapt_records
            self._react(self.watch.settings.adapt_lr_scale, self.watch.settings.adapt_passes)

    def _replay(self, again: Callable[[], list[Any]], passes: int) -> list[Any]:
        """Train the batch's records ``passes`` times more (at the raised rate, its held-out
        records left out as the stream's will be); return the replay's task results."""
        kept = self.handler.passes
        self.handler.passes, self.handler.replay = passes, 1
        try:
            return [f.result for f in again()]
        finally:
            self.handler.passes, self.handler.replay = kept, 0

    def _wind_down(self, trained: int) -> None:
        """Count the batch's records against the raise; back to the configured rate after it."""
        if self._boost_left <= 0:
            return
        self._boost_left -= trained
        if self._boost_left <= 0:
            self._react(1.0, 1)

    def _react(self, scale: float, passes: int) -> None:
        """The learning rate, ``scale`` times the configured one (the server's optimizer's
        now, the replicas' from their next task: the handler travels with it), and each
        task's ``passes`` over its records."""
        self.handler.lr_scale = self._lr_scale = scale
        self.handler.passes = passes
        if self.algorithm is not None:
            self.algorithm.scale_learning_rate(scale)

    def _collect(self, results: Sequence[Any]) -> int:
        """Keep the records the batch's tasks held out (the newest ``window``); return how many."""
        n = 0
        for r in results:
            x, y = getattr(r, "heldout_x", None), getattr(r, "heldout_y", None)
            if x is None or y is None or not len(y):
                continue
            self._x.append(x)
            self._y.append(y)
            self._held += len(y)
            n += len(y)
        while self._y and self._held - len(self._y[0]) >= self.window:
            self._held -= len(self._y.popleft())
            self._x.popleft()
        return n

    def _records(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The newest ``window`` held-out records after the drift, once there are enough."""
        if self._held < MIN_WINDOW:
            return None
        return np.concatenate(self._x)[-self.window :], np.concatenate(self._y)[-self.window :]
