"""What a run reports: a row per micro-batch (typed), the status line people read, and the
final report (``report.json``)."""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.ingest.microbatch import BatchInfo
from pipeline.train.partition import PartitionResult


@dataclasses.dataclass
class BatchRow:
    """One micro-batch's figures, as the report and the plots show them.

    Attributes:
        batch_id: Spark's batch id.
        t: seconds since the run started; ``t_stream``: since the first batch started.
        rows, trained, rejected: records read, trained, and rejected by reason.
        aborted: records of aborted transactions in the batch's ranges, not read (read_committed).
        batch_s: seconds in the batch's tasks; ``lag``: records in Kafka not yet trained.
        staleness_p50, staleness_p99: over the batch's pushes (None: no push).
        clock: the server's clock after the batch.
        compute_s, exchange_s: the workers' seconds computing and exchanging.
        prequential_accuracy, prequential_loss: test-then-train scores (None: no classifier step).
        heldout: held-out scores, on the batches that were scored.
        eval_s_total: seconds spent scoring the held-out split so far.
        checkpoint_ms: milliseconds writing the checkpoint after the batch.
        tasks: per task (one offset range): ``worker``, ``records``, ``steps`` (its
            mini-batches), ``applied`` (those the parameter server counted as applied,
            its own count), ``skipped`` (left to an earlier attempt's pushes),
            ``repeats`` (pushes dropped as repeats), Spark's ``attempt``, and the
            ``transport`` of its exchanges (``shared memory`` or ``tcp``).
    """

    batch_id: int
    t: float
    rows: int
    trained: int
    rejected: dict[str, int]
    batch_s: float
    lag: int
    staleness_p50: float | None
    staleness_p99: float | None
    clock: int
    compute_s: float
    exchange_s: float
    prequential_accuracy: float | None = None
    prequential_loss: float | None = None
    heldout: dict[str, float] | None = None
    t_stream: float = 0.0
    eval_s_total: float = 0.0
    checkpoint_ms: float = 0.0
    tasks: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    aborted: int = 0

    @classmethod
    def from_batch(cls, info: BatchInfo, *, t: float, clock: int) -> BatchRow:
        """The row of a batch whose handler results are :class:`PartitionResult`\\ s."""
        results: list[PartitionResult] = info.results
        staleness = [s for r in results for s in r.staleness]
        scored = [r for r in results if r.preq_n]
        preq_n = sum(r.preq_n for r in scored)
        row = cls(
            batch_id=info.batch_id, t=round(t, 3), rows=info.rows, trained=sum(r.records for r in results),
            rejected=dict(info.rejects), batch_s=round(info.batch_s, 3), lag=sum(info.lag.values()),
            staleness_p50=float(np.percentile(staleness, 50)) if staleness else None,
            staleness_p99=float(np.percentile(staleness, 99)) if staleness else None,
            clock=clock, compute_s=sum(r.compute_s for r in results), exchange_s=sum(r.exchange_s for r in results),
            aborted=info.aborted,
        )
        if preq_n:
            row.prequential_accuracy = sum(r.preq_acc * r.preq_n for r in scored) / preq_n
            row.prequential_loss = sum(r.preq_loss * r.preq_n for r in scored) / preq_n
        return row

    def to_dict(self) -> dict[str, Any]:
        """The row as ``report.json`` has it (scores that were not measured are left out)."""
        d = dataclasses.asdict(self)
        for key in ("prequential_accuracy", "prequential_loss", "heldout"):
            if d[key] is None:
                del d[key]
        return d

    def status(self, *, total: int, per_s: float) -> str:
        """The line printed after the batch.

        >>> BatchRow(3, 1.0, 10, 10, {}, 0.5, 7, 1.0, 2.0, 9, 0.4, 0.1, 0.5).status(total=40, per_s=20)
        'batch    3 | trained       40 |      20/s | lag       7 | staleness p50/p99 1/2 | prequential acc 0.500'
        """
        parts = [f"batch {self.batch_id:>4}", f"trained {total:>8,}", f"{per_s:>7,.0f}/s", f"lag {self.lag:>7,}"]
        if self.staleness_p50 is not None and self.staleness_p99 is not None:
            parts.append(f"staleness p50/p99 {self.staleness_p50:.0f}/{self.staleness_p99:.0f}")
        if self.prequential_accuracy is not None:
            parts.append(f"prequential acc {self.prequential_accuracy:.3f}")
        if self.heldout is not None:
            parts.append("held-out " + " ".join(f"{k} {v:.4f}" for k, v in self.heldout.items()))
        return " | ".join(parts)


class History:
    """The batches this process trained: running totals, the last ``keep`` rows in memory,
    and every row appended to ``path`` (JSON lines) as it comes, so a trainer that never
    stops holds a window, not its whole past.

    Example:
        >>> h = History(keep=2)
        >>> for i in range(3):
        ...     h.add(BatchRow(i, 1.0, 10, 9, {"bad": 1}, 0.5, 0, None, None, i, 0.1, 0.1), ended_at=float(i))
        >>> [row.batch_id for row in h.rows], h.trained(), h.rejected(), h.count
        ([1, 2], 27, 3, 3)
    """

    def __init__(self, *, keep: int = 1000, path: Path | None = None) -> None:
        self.rows: collections.deque[BatchRow] = collections.deque(maxlen=keep)
        self.path = path
        self.count = 0  # rows added
        self.eval_s = 0.0  # scoring the held-out split, between batches
        self.first_batch_at: float | None = None  # time.monotonic() when the first batch began
        self.last_batch_at = 0.0  # and when the last one ended
        self._trained = 0
        self._rejected = 0
        self._aborted = 0

    def add(self, row: BatchRow, *, ended_at: float) -> None:
        self.rows.append(row)
        self.count += 1
        self._trained += row.trained
        self._rejected += sum(row.rejected.values())
        self._aborted += row.aborted
        self.last_batch_at = ended_at
        if self.path is not None:
            with open(self.path, "a") as f:
                f.write(json.dumps(row.to_dict(), default=float) + "\n")

    def trained(self) -> int:
        """Records trained since this process started (a resumed run counts from its resume)."""
        return self._trained

    def rejected(self) -> int:
        return self._rejected

    def aborted(self) -> int:
        """Records of aborted transactions this process's batches left unread."""
        return self._aborted

    def span_s(self) -> float:
        """Streaming time: from the first batch to the end of the last one."""
        return self.last_batch_at - self.first_batch_at if self.first_batch_at is not None else 0.0


@dataclasses.dataclass
class RunReport:
    """The end of a run: settings, totals, speed, final scores, the last batches and the ledger.

    ``batches`` holds this process's last 1,000 batches; ``batches_file`` (``batches.jsonl``)
    has every batch of the run, across resumes.

    ``trained_this_session`` counts from this process's start (a resumed run's figure
    is what it added); ``train_seconds`` runs from the first batch to the end of the
    last (stopping the query, the final evaluation and saving are not training).
    """

    settings: dict[str, Any]
    algorithm: dict[str, Any]
    topic: str
    out: str
    startup_s: float
    trained_records: int
    trained_this_session: int
    rejected_records: int
    train_seconds: float
    records_per_s: float
    records_per_s_excluding_eval: float
    stopped_because: str
    final: dict[str, float]
    batches: list[BatchRow]
    ledger: list[list[Any]]
    parameter_server: dict[str, Any]  # how workers connected, and any request refused
    parallelism: dict[str, int]  # workers asked for, Spark's task slots, replicas that trained at once
    plots: str | None = None
    batches_file: str | None = None
    aborted_records: int = 0  # records of aborted transactions left unread (read_committed)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["batches"] = [row.to_dict() for row in self.batches]
        for key in ("plots", "batches_file"):
            if d[key] is None:
                del d[key]
        return d

    def summary(self) -> str:
        """The run's last line for people."""
        final = " ".join(f"{k} {v:.4f}" for k, v in self.final.items())
        return (f"trained {self.trained_records} records in {self.train_seconds:.1f} s "
                f"({self.records_per_s:.0f}/s after {self.startup_s:.1f} s start-up); "
                f"held-out {final}; stopped: {self.stopped_because}")
