"""The online run's Prometheus figures: each micro-batch's, and the parameter server's and
the lag monitor's as they happen."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

from pipeline import codec
from pipeline.ingest.batch_figures import BatchFigures
from pipeline.ingest.kafka.fetch import UnreadableRange
from pipeline.ingest.offsets import TopicPartition
from pipeline.jobs.report import BATCHES_FILE, REPORT_FILE, read_rows
from pipeline.observe import metrics, refusals
from pipeline.observe.metrics.pace import PaceMeters
from pipeline.observe.metrics.tables import TableMeters
from pipeline.train import checkpoint
from pipeline.train.drift import SIGNALS, Drift
from pipeline.train.freshness import Freshness
from pipeline.train.rows import BatchRow

#: How much of ``batches.jsonl``'s end a resumed run reads for its last scores: a thousand
#: rows or so, many scored ones at any --eval-every worth using.
_TAIL_BYTES = 1 << 20


def _final_score(folder: Path, last_batch_id: int) -> list[tuple[float, float]]:
    """``(when, accuracy)`` of the final score in ``folder``'s report.json, if its session
    ended at batch ``last_batch_id`` (the weights the checkpoint holds); else none."""
    path = folder / REPORT_FILE
    try:
        report = json.loads(path.read_text())
        when = path.stat().st_mtime
    except (OSError, ValueError):
        return []
    batches = report.get("batches") or [{}]
    accuracy = (report.get("final") or {}).get("accuracy")
    if accuracy is None or batches[-1].get("batch_id") != last_batch_id:
        return []
    return [(when, float(accuracy))]


class RunMetrics:
    """Counts a run into :func:`pipeline.observe.metrics.training_metrics`.

    Every labelled series exists from the start at 0, so rates and alerts see a first
    reject or a first exchange as a change rather than a new series; what is not yet
    measured is NaN (a gap in a graph), not 0 (a loss of 0, a batch in 1970). A resumed
    run's totals go on from its checkpoint's (:meth:`restore`), not from 0; which counters
    are the run's and which this process's: :class:`~pipeline.observe.metrics.TrainingMetrics`.
    """

    def __init__(
        self, *, dataset: str, algorithm: str, topic: str, workers: int, clock: int = 0
    ) -> None:
        self.meters = m = metrics.training_metrics()
        self.tables = TableMeters(m.registry)
        self.pace = PaceMeters(m.registry)
        self.topic = topic
        m.info.labels(dataset, algorithm, topic, str(workers)).set(1)
        for gauge in (
            m.prequential_loss,
            m.prequential_accuracy,
            m.heldout_accuracy,
            m.heldout_time,
            m.last_batch_time,
            m.last_batch_duration,
            m.drift_time,
        ):
            gauge.set(float("nan"))
        m.records_ingested.labels(topic)
        m.records_trained.labels(topic)
        m.records_aborted.labels(topic)
        m.records_poisoned.labels(topic)
        for reason in codec.REASONS:
            m.records_rejected.labels(reason)
        for reason in refusals.PS_REFUSALS:
            m.ps_refusals.labels(reason)
        for activity in ("compute", "exchange"):
            m.worker_seconds.labels(activity)
        for signal in SIGNALS:
            m.drift_detected.labels(signal)
        self.restore_clock(clock)
        # Read at each scrape: freshness grows between batches, and a stalled run's must show it.
        self._freshness = Freshness()
        m.freshness.set_function(self.freshness_s)

    def freshness_s(self) -> float:
        """The model's freshness now (NaN: nothing learned yet)."""
        seconds = self._freshness.seconds(time.time())
        return math.nan if seconds is None else seconds

    def restore_clock(self, clock: int) -> None:
        """The server's clock at start (a resumed run's is not 0)."""
        self._clock_seen = clock
        self.meters.clock.set(clock)

    def restore(self, state: checkpoint.State, folder: str | os.PathLike[str]) -> None:
        """A resumed run's figures from its checkpoint, set before /metrics serves a first
        scrape: the clock, the records trained and the batches applied go on from the
        checkpoint's totals (Prometheus sees the counters continue, neither a reset to 0 nor
        a jump), the last batch's time is when it was saved, the model's freshness goes on
        from the data the checkpoint holds, and the last known scores (the held-out one with
        the time it was measured) and the last batch's duration come from the run's rows
        (``batches.jsonl``), so no panel reads NaN until batches come."""
        self.restore_clock(state.clock)
        self._freshness = Freshness.from_state(state.extra.get("freshness"))
        if state.last_batch_id < 0:
            return
        self.on_drift([Drift.from_dict(d) for d in state.extra.get("drift", [])])
        self.meters.records_trained.labels(self.topic).inc(int(state.extra.get("trained", 0)))
        self.meters.batches.inc(state.last_batch_id + 1)
        for path in (
            checkpoint.generation_path(folder, state.last_batch_id),
            Path(folder) / checkpoint.FILENAME,
        ):
            if path.is_file():
                self.meters.last_batch_time.set(path.stat().st_mtime)
                break
        # The rows up to the checkpoint's batch (a rewound run's later rows are not its weights').
        rows = [
            r
            for r in read_rows(Path(folder) / BATCHES_FILE, tail_bytes=_TAIL_BYTES)
            if r.get("batch_id", -1) <= state.last_batch_id
        ]
        m = self.meters
        if rows:
            m.last_batch_duration.set(rows[-1]["batch_s"])
        preq = [r for r in rows if "prequential_accuracy" in r and "prequential_loss" in r]
        if preq:
            m.prequential_accuracy.set(preq[-1]["prequential_accuracy"])
            m.prequential_loss.set(preq[-1]["prequential_loss"])
        # The last score measured: a scored batch's, or the final one of a session that ended
        # at the checkpoint's batch (report.json's); a row of an older version has no time.
        scored = [
            (r["at"], r["heldout"]["accuracy"])
            for r in rows
            if "accuracy" in r.get("heldout", {}) and r.get("at")
        ]
        last = max([*scored, *_final_score(Path(folder), state.last_batch_id)], default=None)
        if last is not None:
            m.heldout_time.set(last[0])
            m.heldout_accuracy.set(last[1])

    def on_drift(self, drifts: list[Drift]) -> None:
        """Drifts found (or a resumed run's, from its checkpoint): counted, the last one's time
        set."""
        for d in drifts:
            self.meters.drift_detected.labels(d.signal).inc()
            self.meters.drift_time.set(d.at)

    def on_ps_request(self, op: str, seconds: float) -> None:
        self.meters.ps_request_duration.labels(op).observe(seconds)

    def on_ps_refusal(self, reason: str) -> None:
        self.meters.ps_refusals.labels(reason).inc()

    def on_ps_event(self, name: str) -> None:
        """A short synchronous round or a worker's broken connection."""
        counter = {
            "short_round": self.meters.ps_short_rounds,
            "broken": self.meters.ps_broken_connections,
        }.get(name)
        if counter is not None:
            counter.inc()

    def on_lag(self, lag: dict[TopicPartition, int]) -> None:
        """The lag monitor's refresh, about once a second: the lag, and a sample of the
        model's freshness (so the histogram weighs each second alike, batch or none)."""
        self._set_lag(lag)
        seconds = self._freshness.seconds(time.time())
        if seconds is not None:
            self.meters.freshness_sampled.observe(seconds)

    def _set_lag(self, lag: dict[TopicPartition, int]) -> None:
        for (topic, part), n in lag.items():
            self.meters.consumer_lag.labels(topic, str(part)).set(n)

    def on_unreadable(self, error: UnreadableRange, lag: dict[TopicPartition, int]) -> None:
        """A batch that cannot be read stops the run: counted, and its records as lag."""
        self.meters.unreadable_batches.labels(error.topic, str(error.partition)).inc()
        self._set_lag(lag)

    def on_final(self, scores: dict[str, float]) -> None:
        """The held-out score after the last batch (it may come after the last scored batch)."""
        if "accuracy" in scores:  # a numeric target has an error instead (in the report)
            self.meters.heldout_accuracy.set(scores["accuracy"])
            self.meters.heldout_time.set_to_current_time()

    def on_rejects(self, rejects: dict[str, int]) -> None:
        """Records set aside outside a batch (the rows a run's replay could not send), by reason."""
        for reason, n in rejects.items():
            self.meters.records_rejected.labels(reason).inc(n)

    def skipped(self) -> None:
        self.meters.batches_skipped.inc()

    def on_batch(self, info: BatchFigures, row: BatchRow) -> None:
        m = self.meters
        m.records_ingested.labels(self.topic).inc(info.rows)
        m.records_trained.labels(self.topic).inc(row.trained)
        m.records_aborted.labels(self.topic).inc(info.aborted)
        m.records_poisoned.labels(self.topic).inc(info.poisoned)
        for reason, n in info.rejects.items():
            m.records_rejected.labels(reason).inc(n)
        m.batches.inc()
        m.batch_duration.observe(info.batch_s)
        m.last_batch_duration.set(info.batch_s)
        self._set_lag(info.lag)
        for r in info.results:
            for s in r.staleness:
                m.staleness.observe(s)
        m.updates_applied.inc(max(0, row.clock - self._clock_seen))
        self._clock_seen = row.clock
        m.clock.set(row.clock)
        m.last_batch_time.set_to_current_time()
        self.tables.on_batch(row.tables, info.results)
        m.worker_seconds.labels("compute").inc(row.compute_s)
        m.worker_seconds.labels("exchange").inc(row.exchange_s)
        if row.data_as_of is not None:  # the newest data the saved center holds
            self._freshness.as_of = row.data_as_of
        if row.prequential_accuracy is not None and row.prequential_loss is not None:
            m.prequential_accuracy.set(row.prequential_accuracy)
            m.prequential_loss.set(row.prequential_loss)
        if row.heldout is not None and "accuracy" in row.heldout:
            m.heldout_accuracy.set(row.heldout["accuracy"])
            m.heldout_time.set_to_current_time()
