"""How a run ends: its stop rule (a reason found, the records set aside past
``--max-rejected``, or all the replay sent handled), what stopped it, and the report it
draws and writes.

:class:`~pipeline.jobs.online.Run` asks :meth:`RunEnd.until` after each batch and hands
:meth:`RunEnd.report` the final figures once the query stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.errors import StreamtrainError
from pipeline.jobs.display import Display
from pipeline.jobs.replay_process import ReplayProcess
from pipeline.jobs.report import REPORT_FILE, History, RunReport
from pipeline.jobs.run_config import RunConfig
from pipeline.jobs.run_metrics import RunMetrics
from pipeline.jobs.run_training import RunTraining
from pipeline.train import algorithms


class RunEnd:
    """When one run stops, why, and its report.

    Args:
        cfg: the run's settings.
        algorithm: the run's algorithm (the report shows its config).
        topic: the topic the run trains from.
        out: the run's folder (the report and its picture go there).
        history: the run's trained batches.
        display: the run's status lines (its stop reason, the records set aside).
        metrics: the run's figures on /metrics (the replay's rows set aside, as they come).
        training: the run's training half (what it trained and handled).
    """

    def __init__(
        self,
        cfg: RunConfig,
        algorithm: algorithms.Algorithm,
        *,
        topic: str,
        out: Path,
        history: History,
        display: Display,
        metrics: RunMetrics,
        training: RunTraining,
    ) -> None:
        self.cfg, self.algorithm, self.topic, self.out = cfg, algorithm, topic, out
        self.history, self.display, self.metrics = history, display, metrics
        self.training = training
        #: What stopped the query, raised once it stopped.
        self.failure: StreamtrainError | None = None

    def until(self, replay: ReplayProcess | None) -> bool:
        """Whether to stop: a reason was found, the records set aside passed --max-rejected, or
        the replay is over and all it sent is handled."""
        if self.display.stop_reason:
            return True
        over = replay is not None and replay.done()
        rejects = self.display.rejects
        if replay is not None:  # the rows it could not send, on /metrics as they come
            self.metrics.on_rejects(rejects.add_replay(replay.malformed))
        done = self.training.handled  # trained, or held out after a drift
        handled = over and done + self.history.rejected() >= (replay.sent or 0)  # type: ignore[union-attr]
        self.failure = rejects.verdict(final=handled)
        if self.failure is not None or handled:
            self.display.stop_reason = (
                "too many records rejected" if self.failure else "all produced records trained"
            )
        return self.failure is not None or handled

    def report(
        self, final: dict[str, float], startup_s: float, ps_stats: dict[str, Any]
    ) -> RunReport:
        """The run's report, drawn and written to ``<out>/report.json``."""
        driver = self.training.driver
        assert driver is not None and driver.state is not None
        report = RunReport.of_run(
            settings=self.cfg.report_settings(),
            algorithm=algorithms.serialize(self.algorithm),
            topic=self.topic,
            out=self.out,
            startup_s=startup_s,
            trained=self.training.trained,
            history=self.history,
            stopped_because=self.display.stop_reason or "limit (--max-batches / --timeout)",
            final=final,
            ledger=driver.state.ledger,
            ps_stats=ps_stats,
            workers=self.cfg.workers,
            slots=self.training.cores,
            rejects=self.display.rejects,
            drifts=driver.drift.watch.found if driver.drift else [],
        )
        report.draw(
            self.out,
            name=self.cfg.name,
            eval_every=self.cfg.eval_every,
            eval_records=len(self.training.evaluation.y),
            eval_share=self.cfg.eval_share,
        )
        (self.out / REPORT_FILE).write_text(json.dumps(report.to_dict(), indent=2, default=float))
        return report
