"""What a trained micro-batch adds up to: a row per batch, with a row per task in it, as the
report, ``batches.jsonl``, the metrics and the plots read them."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from pipeline.ingest.batch_figures import BatchFigures
from pipeline.ingest.offsets import PassedOver
from pipeline.train.drift import Drift
from pipeline.train.partition import TaskResult, hist_auc


@dataclasses.dataclass
class TaskRow:
    """One task (one offset range) of a trained batch, checked against the parameter server.

    Attributes:
        worker: the worker (Spark partition) that trained it.
        records: records it trained.
        steps: its mini-batches, over all attempts.
        applied: those the parameter server counted as applied (its own count).
        skipped: those left to an earlier attempt's pushes (Spark retried the task).
        repeats: pushes the server dropped as repeats (a speculative copy ran beside it).
        attempt: Spark's attempt number.
        transport: how its exchanges went: ``shared memory``, ``tcp``, or ``tcp bfloat16`` or
            ``tcp float16`` (``--wire-dtype``).
    """

    worker: int
    records: int
    steps: int
    applied: int
    skipped: int
    repeats: int
    attempt: int
    transport: str

    @classmethod
    def of(cls, result: TaskResult, *, applied: int) -> TaskRow:
        """The row of a task's ``result``, of which the server applied ``applied`` mini-batches."""
        return cls(
            worker=result.worker,
            records=result.records,
            steps=result.steps_total,
            applied=applied,
            skipped=result.steps_skipped,
            repeats=result.repeats,
            attempt=result.attempt,
            transport="shared memory"
            if result.shared_memory
            else "tcp"
            if result.wire_dtype == "float32"
            else f"tcp {result.wire_dtype}",
        )


@dataclasses.dataclass
class TableSize:
    """One ID table after a batch: its rows, its bytes, its rows created and expired so far
    (this trainer's counts)."""

    rows: int
    bytes: int
    created: int
    expired: int


@dataclasses.dataclass
class TableFigures:
    """An ID model's tables in one batch.

    Attributes:
        rows_read, rows_pushed: rows the workers read and pushed.
        rows_s: the workers' seconds in requests to the row servers (part of ``exchange_s``).
        staleness_p50, staleness_p99: over the row pushes (None: none).
        expired: rows dropped after the batch (``ttl``).
        sizes: each table after the batch, by name.
    """

    rows_read: int = 0
    rows_pushed: int = 0
    rows_s: float = 0.0
    staleness_p50: float | None = None
    staleness_p99: float | None = None
    expired: int = 0
    sizes: dict[str, TableSize] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class BatchRow:
    """One micro-batch's figures, as the report and the plots show them.

    Attributes:
        batch_id: Spark's batch id.
        t: seconds since the run started; ``t_stream``: since the first batch started.
        rows, trained, rejected: records read, trained, and rejected by reason.
        aborted: records of aborted transactions in the batch's ranges, not read (read_committed).
        poison: the unreadable batches passed over (``--on-poison skip``).
        batch_s: seconds in the batch's tasks; ``lag``: records in Kafka not yet trained.
        staleness_p50, staleness_p99: over the batch's pushes (None: no push).
        clock: the server's clock after the batch.
        compute_s, exchange_s: the workers' seconds computing and exchanging.
        prequential_accuracy, prequential_loss: test-then-train scores (None: no classifier step).
        heldout: held-out scores, on the batches that were scored.
        eval_s_total: seconds spent scoring the held-out split so far.
        checkpoint_ms: milliseconds writing the checkpoint after the batch.
        read_decode_s, task_s: the tasks' seconds reading and decoding their ranges, and
            training them (compute, exchange and the rest: see :mod:`pipeline.train.breakdown`).
        commit_s: the driver's seconds checking and saving the batch after its tasks.
        freshness_s: the model's freshness once the batch was saved: now minus the newest
            Kafka timestamp the center holds, the oldest partition's
            (:mod:`pipeline.train.freshness`; None: unknown); ``data_as_of``: that newest
            timestamp (Unix seconds), from which the freshness at any later time follows.
        at: Unix time when the batch's tasks were done (``t`` restarts with each session; this
            places a row of any session on one clock, for the report and a resumed run's figures).
        tasks: a row per task (one offset range), checked against the parameter server.
        held_out: records held out of training after a drift (:mod:`pipeline.train.adapt`).
        drifts: the drifts the batch showed.
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
    tasks: list[TaskRow] = dataclasses.field(default_factory=list)
    aborted: int = 0
    poison: list[PassedOver] = dataclasses.field(default_factory=list)
    read_decode_s: float = 0.0
    task_s: float = 0.0
    commit_s: float = 0.0
    freshness_s: float | None = None
    data_as_of: float | None = None
    at: float = 0.0
    held_out: int = 0
    drifts: list[Drift] = dataclasses.field(default_factory=list)
    #: An ID model's tables: rows read and pushed in the batch, the row pushes' staleness,
    #: rows expired after it, and each table's rows and bytes (None: no ID features).
    tables: TableFigures | None = None
    #: A binary classifier's prequential AUC over the batch, and the binned scores it comes
    #: from (negatives', positives'; summed over batches they give any stretch's AUC).
    prequential_auc: float | None = None
    prequential_hist: list[list[int]] | None = None

    @classmethod
    def from_batch(cls, info: BatchFigures, *, t: float, clock: int) -> BatchRow:
        """The row of a batch whose handler results are :class:`TaskResult`\\ s."""
        results: list[TaskResult] = info.results
        staleness = [s for r in results for s in r.staleness]
        scored = [r for r in results if r.preq_n]
        preq_n = sum(r.preq_n for r in scored)
        row = cls(
            batch_id=info.batch_id,
            t=round(t, 3),
            rows=info.rows,
            trained=sum(r.records for r in results),
            rejected=dict(info.rejects),
            batch_s=round(info.batch_s, 3),
            lag=sum(info.lag.values()),
            staleness_p50=float(np.percentile(staleness, 50)) if staleness else None,
            staleness_p99=float(np.percentile(staleness, 99)) if staleness else None,
            clock=clock,
            compute_s=sum(r.compute_s for r in results),
            exchange_s=sum(r.exchange_s for r in results),
            aborted=info.aborted,
            poison=list(info.poison),
            read_decode_s=round(info.decode_s, 3),
            task_s=round(info.handler_s, 3),
            at=round(time.time(), 3),
        )
        read = sum(getattr(r, "rows_read", 0) for r in results)
        if read:
            stale = [s for r in results for s in getattr(r, "row_staleness", ())]
            row.tables = TableFigures(
                rows_read=read,
                rows_pushed=sum(r.rows_pushed for r in results),
                rows_s=round(sum(r.rows_s for r in results), 3),
                staleness_p50=float(np.percentile(stale, 50)) if stale else None,
                staleness_p99=float(np.percentile(stale, 99)) if stale else None,
            )
        hists = [r.preq_hist for r in results if getattr(r, "preq_hist", None) is not None]
        if hists:
            summed = np.sum(np.asarray(hists, np.int64), axis=0)
            row.prequential_hist = summed.tolist()
            row.prequential_auc = hist_auc(summed)
        if preq_n:
            row.prequential_accuracy = sum(r.preq_acc * r.preq_n for r in scored) / preq_n
            row.prequential_loss = sum(r.preq_loss * r.preq_n for r in scored) / preq_n
        return row

    def to_dict(self) -> dict[str, Any]:
        """The row as ``report.json`` has it (scores that were not measured are left out)."""
        d = dataclasses.asdict(self)
        for key in (
            "prequential_accuracy",
            "prequential_loss",
            "heldout",
            "freshness_s",
            "data_as_of",
            "tables",
            "prequential_auc",
            "prequential_hist",
        ):
            if d[key] is None:
                del d[key]
        for key in ("poison", "drifts"):
            if not d[key]:
                del d[key]
        if not d["held_out"]:
            del d["held_out"]
        return d

    def status(self, *, total: int, per_s: float, loss: str | None = None) -> str:
        """The line printed after the batch; ``loss``: a numeric target's loss function (its
        prequential error is shown instead of an accuracy, which it has none of).

        >>> BatchRow(3, 1.0, 10, 10, {}, 0.5, 7, 1.0, 2.0, 9, 0.4, 0.1, 0.5).status(
        ...     total=40, per_s=20
        ... )  # doctest: +NORMALIZE_WHITESPACE
        'batch    3 | trained       40 |      20/s | lag       7 | staleness p50/p99 1/2 |
        prequential acc 0.500'
        >>> BatchRow(
        ...     3, 1.0, 10, 10, {}, 0.5, 7, None, None, 9, 0.4, 0.1, float("nan"), 2500.0
        ... ).status(total=40, per_s=20, loss="mean_squared_error").split(" | ")[-1]
        'prequential rmse 50'
        """
        parts = [
            f"batch {self.batch_id:>4}",
            f"trained {total:>8,}",
            f"{per_s:>7,.0f}/s",
            f"lag {self.lag:>7,}",
        ]
        if self.staleness_p50 is not None and self.staleness_p99 is not None:
            parts.append(f"staleness p50/p99 {self.staleness_p50:.0f}/{self.staleness_p99:.0f}")
        if loss is not None:
            if self.prequential_loss is not None and np.isfinite(self.prequential_loss):
                rmse = loss in ("mean_squared_error", "mse")
                parts.append(
                    f"prequential rmse {np.sqrt(self.prequential_loss):.4g}"
                    if rmse
                    else f"prequential loss {self.prequential_loss:.4g}"
                )
        elif self.prequential_accuracy is not None:
            parts.append(
                f"prequential acc {self.prequential_accuracy:.3f}"
                + (f" auc {self.prequential_auc:.3f}" if self.prequential_auc is not None else "")
            )
        if self.heldout is not None:
            parts.append("held-out " + " ".join(f"{k} {v:.4f}" for k, v in self.heldout.items()))
        return " | ".join(parts)
