"""What a run reports: its batches' rows (:class:`~pipeline.train.rows.BatchRow`) kept and
appended as they come, and the final report (``report.json``)."""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipeline.ingest.offsets import PassedOver
from pipeline.jobs import batch_log
from pipeline.jobs.rejects import Rejects
from pipeline.train.breakdown import Breakdown, exchange_parts
from pipeline.train.drift import Drift
from pipeline.train.rows import BatchRow

log = logging.getLogger(__name__)

#: The end of ``batches.jsonl`` the picture draws: every batch of a run up to some 60,000
#: (a trainer that runs for months draws its last ones).
_PLOT_TAIL_BYTES = 64 << 20
#: The report of a run's last session.
REPORT_FILE = "report.json"
#: Every batch's row, one JSON line each, appended as the run goes, across resumes (the
#: report keeps this session's last 1,000; its picture reads them all), kept within
#: :data:`batch_log.MAX_BYTES` by merging older rows (:mod:`pipeline.jobs.batch_log`).
BATCHES_FILE = "batches.jsonl"


class History:
    """The batches this process trained: running totals, the last ``keep`` rows in memory,
    and every row appended to ``path`` (JSON lines) as it comes, so a trainer that never
    stops holds a window, not its whole past.

    Example:
        >>> h = History(keep=2)
        >>> for i in range(3):
        ...     h.add(
        ...         BatchRow(i, 1.0, 10, 9, {"bad": 1}, 0.5, 0, None, None, i, 0.1, 0.1),
        ...         ended_at=float(i),
        ...     )
        >>> [row.batch_id for row in h.rows], h.trained(), h.rejected(), h.count
        ([1, 2], 27, 3, 3)
    """

    def __init__(
        self, *, keep: int = 1000, path: Path | None = None, max_bytes: int = batch_log.MAX_BYTES
    ) -> None:
        self.rows: collections.deque[BatchRow] = collections.deque(maxlen=keep)
        self.path = path
        self.max_bytes = max_bytes  # the file's bound
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
        self.breakdown.add(
            batch_s=row.batch_s,
            commit_s=row.commit_s,
            read_decode_s=row.read_decode_s,
            compute_s=row.compute_s,
            exchange_s=row.exchange_s,
            task_s=row.task_s,
            checkpoint_s=row.checkpoint_ms / 1000,
        )
        self.last_batch_at = ended_at
        if self.path is not None:  # bounded: older rows are merged as the file grows
            batch_log.append_row(self.path, row.to_dict(), max_bytes=self.max_bytes)

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


def read_rows(
    path: str | os.PathLike[str], *, tail_bytes: int | None = None
) -> list[dict[str, Any]]:
    """The rows a run appended to ``path`` (``batches.jsonl``), every session's, oldest first.

    With ``tail_bytes``, only the whole lines among its last bytes (a resumed run wants its
    last rows, not a file that grows for months). A line a kill cut short is left out;
    no file: no rows.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = Path(d) / "batches.jsonl"
        ...     _ = p.write_text(chr(10).join(['{"batch_id": 0}', '{"batch_id": 1}', '{"batch_']))
        ...     (
        ...         [r["batch_id"] for r in read_rows(p)],
        ...         [r["batch_id"] for r in read_rows(p, tail_bytes=26)],
        ...     )
        ([0, 1], [1])
    """
    try:
        with open(path, "rb") as f:
            start = 0 if tail_bytes is None else max(0, f.seek(0, os.SEEK_END) - tail_bytes)
            f.seek(start)
            if start:
                f.readline()  # the rest of a line that began before the tail
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    rows = []
    for line in lines:
        try:
            rows.append(json.loads(line))
        except ValueError:  # the last line of a killed run, half written
            continue
    return rows


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
    parallelism: dict[
        str, int
    ]  # workers asked for, Spark's task slots, replicas that trained at once
    plots: str | None = None
    batches_file: str | None = None
    aborted_records: int = 0  # records of aborted transactions left unread (read_committed)
    poison: list[PassedOver] = dataclasses.field(
        default_factory=list
    )  # unreadable batches passed over
    #: Each task slot's streaming time by part (:mod:`pipeline.train.breakdown`), and the seconds
    #: behind it.
    time_shares: dict[str, float] = dataclasses.field(default_factory=dict)
    time_seconds: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: A synchronous run's exchange by part (:func:`pipeline.train.breakdown.exchange_parts`).
    exchange_parts: dict[str, float] = dataclasses.field(default_factory=dict)
    #: What was set aside (:meth:`pipeline.jobs.rejects.Rejects.to_dict`): by reason, and the
    #: replay's first rows.
    rejected: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Every drift the run found, across resumes (:class:`pipeline.train.drift.Drift`).
    drifts: list[Drift] = dataclasses.field(default_factory=list)

    @classmethod
    def of_run(
        cls,
        *,
        settings: dict[str, Any],
        algorithm: dict[str, Any],
        topic: str,
        out: Path,
        startup_s: float,
        trained: int,
        history: History,
        stopped_because: str,
        final: dict[str, float],
        ledger: list[list[Any]],
        ps_stats: dict[str, Any],
        workers: int,
        slots: int,
        rejects: Rejects,
        drifts: Sequence[Drift] = (),
    ) -> RunReport:
        """The report of a run that streamed ``history``, ``trained`` records across its
        sessions, and set aside what ``rejects`` counts."""
        here, span = history.trained(), history.span_s()
        return cls(
            settings=settings,
            algorithm=algorithm,
            topic=topic,
            out=str(out),
            startup_s=round(startup_s, 2),
            trained_records=trained,
            trained_this_session=here,
            rejected_records=rejects.total,
            train_seconds=round(span, 2),
            records_per_s=round(here / span, 1) if span else 0.0,
            records_per_s_excluding_eval=round(here / (span - history.eval_s), 1)
            if span > history.eval_s
            else 0.0,
            stopped_because=stopped_because,
            final=final,
            batches=list(history.rows),
            batches_file=str(out / BATCHES_FILE),
            ledger=ledger,
            parameter_server={
                **{
                    k: ps_stats.get(k)
                    for k in (
                        "ops",
                        "shared_memory",
                        "refused",
                        "broken_connections",
                        "short_rounds",
                    )
                },
                "shards": len(ps_stats.get("shards", ())) or 1,
            },
            parallelism={
                "workers": workers,
                "task_slots": slots,
                "concurrent_replicas": min(workers, slots),
            },
            aborted_records=history.aborted(),
            poison=history.poison,
            rejected=rejects.to_dict(),
            time_shares=history.breakdown.shares(
                slots=min(workers, slots), wall_s=span, eval_s=history.eval_s
            ),
            time_seconds=history.breakdown.state(),
            # With --sync-overlap the workers time only the exchange the next gradient does not
            # hide, while the server counts all of it: the shares would not add up.
            exchange_parts={}
            if settings.get("sync_overlap")
            else exchange_parts(history.breakdown.seconds["exchange"], ps_stats),
            drifts=list(drifts),
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["batches"] = [row.to_dict() for row in self.batches]
        for key in ("plots", "batches_file"):
            if d[key] is None:
                del d[key]
        return d

    def summary(self) -> str:
        """The run's last line for people: this session's records, time and speed together,
        a resumed run's total beside them, what was set aside, and the score (none for a
        model that trained nothing).

        >>> r = RunReport(
        ...     {},
        ...     {},
        ...     "t",
        ...     "o",
        ...     13.1,
        ...     462_384,
        ...     91_304,
        ...     0,
        ...     388.0,
        ...     235.3,
        ...     240.0,
        ...     "SIGTERM",
        ...     {"accuracy": 0.5},
        ...     [],
        ...     [],
        ...     {},
        ...     {},
        ... )
        >>> r.summary()  # doctest: +NORMALIZE_WHITESPACE
        'trained 91,304 records in 388.0 s (235/s after 13.1 s start-up), 462,384 in the whole run;
        held-out accuracy 0.5000; stopped: SIGTERM'
        """
        final = (
            "held-out " + " ".join(f"{k} {v:.4f}" for k, v in self.final.items())
            if self.final
            else "no held-out score" + ("" if self.trained_records else " (nothing trained)")
        )
        reasons = list((self.rejected.get("by_reason") or {}).items())[:3]
        rejected = (
            f"; rejected {self.rejected_records:,} ("
            + ", ".join(f"{k} {n:,}" for k, n in reasons)
            + ")"
            if self.rejected_records and reasons
            else ""
        )
        run = (
            f", {self.trained_records:,} in the whole run"
            if self.trained_records != self.trained_this_session
            else ""
        )
        return (
            f"trained {self.trained_this_session:,} records in {self.train_seconds:.1f} s "
            f"({self.records_per_s:.0f}/s after {self.startup_s:.1f} s start-up){run}{rejected}; "
            f"{final}; stopped: {self.stopped_because}"
        )

    def draw(
        self,
        out: Path,
        *,
        name: str,
        eval_every: int,
        eval_records: int,
        eval_share: float | None = None,
    ) -> None:
        """Draw ``out/report.png`` from every session's rows in ``out/batches.jsonl``, and
        name it in :attr:`plots` (a failed picture never fails a finished run);
        ``eval_share``: the share of the time scoring may take (a freshness target), or None."""
        from pipeline.observe import report_plot

        rows = read_rows(out / BATCHES_FILE, tail_bytes=_PLOT_TAIL_BYTES)
        if not rows:
            return
        path = out / "report.png"
        settings = self.settings
        try:
            report_plot.report_plots(
                rows,
                path,
                final=self.final.get("accuracy"),
                eval_every=eval_every,
                eval_records=eval_records,
                eval_share=eval_share,
                title=f"{name} with {settings.get('algorithm')}, {settings.get('workers')} "
                f"workers ({out.name})",
            )
            self.plots = str(path)
        except Exception as e:  # the model and the report matter more than a picture
            log.warning("could not draw the report plots: %s: %s", type(e).__name__, e)

    def time_line(self) -> str:
        """Where each task slot's streaming time went (:mod:`pipeline.train.breakdown`).

        >>> RunReport({}, {}, "t", "o", 1.0, 0, 0, 0, 0.0, 0.0, 0.0, "", {}, [], [], {}, {},
        ...           time_shares={"compute": 0.9, "exchange": 0.05, "commit": 0.0}).time_line()
        'time per task slot: compute 90%, exchange 5%, commit 0%'
        >>> RunReport({}, {}, "t", "o", 1.0, 0, 0, 0, 0.0, 0.0, 0.0, "", {}, [], [], {}, {},
        ...           time_shares={"compute": 0.8, "exchange": 0.2},
        ...           exchange_parts={"round_wait": 0.4, "server_step": 0.25}).time_line()
        'time per task slot: compute 80%, exchange 20% (round wait 40%, server step 25%)'
        """
        parts = ", ".join(f"{k.replace('_', ' ')} {v:.0%}" for k, v in self.exchange_parts.items())
        return "time per task slot: " + ", ".join(
            f"{k.replace('_', ' ')} {v:.0%}" + (f" ({parts})" if k == "exchange" and parts else "")
            for k, v in self.time_shares.items()
        )
