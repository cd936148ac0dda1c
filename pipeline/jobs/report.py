"""What a run reports: its batches' rows (:class:`~pipeline.train.rows.BatchRow`) kept and
appended as they come, and the final report (``report.json``)."""

from __future__ import annotations

import collections
import dataclasses
import json
from pathlib import Path
from typing import Any

from pipeline.ingest.offsets import PassedOver
from pipeline.jobs.rejects import Rejects
from pipeline.train.breakdown import Breakdown
from pipeline.train.rows import BatchRow

#: Every batch's row, one JSON line each, appended as the run goes (the report keeps the last 1,000).
BATCHES_FILE = "batches.jsonl"


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
        self.first_trained_at: float | None = None  # and when it was trained (start-up's end)
        self.last_batch_at = 0.0  # and when the last one ended
        self._trained = 0
        self._rejected = 0
        self._aborted = 0
        self.poison: list[PassedOver] = []  # every unreadable batch passed over
        self.breakdown = Breakdown()  # where the batches' time went, over every batch

    def add(self, row: BatchRow, *, ended_at: float) -> None:
        self.rows.append(row)
        self.count += 1
        self._trained += row.trained
        self._rejected += sum(row.rejected.values())
        self._aborted += row.aborted
        self.poison += row.poison
        self.breakdown.add(batch_s=row.batch_s, commit_s=row.commit_s, read_decode_s=row.read_decode_s,
                           compute_s=row.compute_s, exchange_s=row.exchange_s, task_s=row.task_s)
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

    def startup_s(self, started: float) -> float | None:
        """Start-up as the README defines it: from ``started`` (the launch) to the end of the
        first trained batch; None before one."""
        return None if self.first_trained_at is None else self.first_trained_at - started

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
    poison: list[PassedOver] = dataclasses.field(default_factory=list)  # unreadable batches passed over
    #: Each task slot's streaming time by part (:mod:`pipeline.train.breakdown`), and the seconds behind it.
    time_shares: dict[str, float] = dataclasses.field(default_factory=dict)
    time_seconds: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: What was set aside (:meth:`pipeline.jobs.rejects.Rejects.to_dict`): by reason, and the replay's first rows.
    rejected: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of_run(cls, *, settings: dict[str, Any], algorithm: dict[str, Any], topic: str, out: Path, startup_s: float,
               trained: int, history: History, stopped_because: str, final: dict[str, float], ledger: list[list[Any]],
               ps_stats: dict[str, Any], workers: int, slots: int, rejects: Rejects) -> RunReport:
        """The report of a run that streamed ``history``, ``trained`` records across its
        sessions, and set aside what ``rejects`` counts."""
        here, span = history.trained(), history.span_s()
        return cls(
            settings=settings, algorithm=algorithm, topic=topic, out=str(out), startup_s=round(startup_s, 2),
            trained_records=trained, trained_this_session=here, rejected_records=rejects.total,
            train_seconds=round(span, 2), records_per_s=round(here / span, 1) if span else 0.0,
            records_per_s_excluding_eval=round(here / (span - history.eval_s), 1) if span > history.eval_s else 0.0,
            stopped_because=stopped_because, final=final, batches=list(history.rows),
            batches_file=str(out / BATCHES_FILE), ledger=ledger,
            parameter_server={**{k: ps_stats.get(k) for k in ("ops", "shared_memory", "refused", "broken_connections",
                                                                   "short_rounds")},
                              "shards": len(ps_stats.get("shards", ())) or 1},
            parallelism={"workers": workers, "task_slots": slots, "concurrent_replicas": min(workers, slots)},
            aborted_records=history.aborted(), poison=history.poison, rejected=rejects.to_dict(),
            time_shares=history.breakdown.shares(slots=min(workers, slots), wall_s=span, eval_s=history.eval_s),
            time_seconds=history.breakdown.state(),
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["batches"] = [row.to_dict() for row in self.batches]
        for key in ("plots", "batches_file"):
            if d[key] is None:
                del d[key]
        return d

    def summary(self) -> str:
        """The run's last line for people."""
        final = ("held-out " + " ".join(f"{k} {v:.4f}" for k, v in self.final.items()) if self.final else
                 "no held-out score" + ("" if self.trained_records else " (nothing trained)"))
        reasons = list((self.rejected.get("by_reason") or {}).items())[:3]
        rejected = (f"; rejected {self.rejected_records:,} (" + ", ".join(f"{k} {n:,}" for k, n in reasons) + ")"
                    if self.rejected_records and reasons else "")
        return (f"trained {self.trained_records} records in {self.train_seconds:.1f} s "
                f"({self.records_per_s:.0f}/s after {self.startup_s:.1f} s start-up){rejected}; "
                f"{final}; stopped: {self.stopped_because}")

    def time_line(self) -> str:
        """Where each task slot's streaming time went (:mod:`pipeline.train.breakdown`).

        >>> RunReport({}, {}, "t", "o", 1.0, 0, 0, 0, 0.0, 0.0, 0.0, "", {}, [], [], {}, {},
        ...           time_shares={"compute": 0.9, "exchange": 0.05, "commit": 0.0}).time_line()
        'time per task slot: compute 90%, exchange 5%, commit 0%'
        """
        return "time per task slot: " + ", ".join(f"{k.replace('_', ' ')} {v:.0%}" for k, v in self.time_shares.items())
