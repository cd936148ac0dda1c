"""The run's replay producer, in a process of its own so that sending never competes with
the driver's threads; it hands back its :class:`~producers.replay.ReplayReport` as data,
not as a line to parse."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.cluster.processes import ChildFailed, ChildProcess
from pipeline.errors import StreamtrainError

if TYPE_CHECKING:
    from producers.replay import ReplayReport
    from producers.report import MalformedSoFar

log = logging.getLogger(__name__)

#: The share of malformed rows at which ``streamtrain produce`` of a table fails (a run
#: decides itself, by ``--max-rejected``, from what its replay tells it as it goes).
MOST_ROWS = 0.5


def _replay(job: dict[str, Any], answer: Any, stop: threading.Event) -> None:
    """The child's work: replay ``job["dataset"]`` and answer its report.

    Args:
        job: ``dataset`` (a name), ``data_dir``, ``metrics_host``, ``metrics_port`` and the
            :class:`~producers.replay.Replay` arguments.
        answer: sends the :class:`~producers.replay.ReplayReport` to the run.
        stop: set when the run stops the replay (it flushes what it handed to Kafka).
    """
    from producers import datasets
    from producers.replay import replay_with_metrics

    table = job.pop("table", None)
    if table is not None:  # a user's file, by the run's schema
        from pipeline.table import TableSchema

        data: datasets.Dataset = datasets.Table(
            table["path"],
            schema=TableSchema.from_dict(table["schema"]),
            holdout=table["holdout"],
            name=table["name"],
        )
        job.pop("dataset"), job.pop("data_dir")
    else:
        data = datasets.get(job.pop("dataset"), data_dir=Path(job.pop("data_dir")))
    # The rows set aside go to the run as they happen: it shows them, and stops past --max-rejected.
    result = replay_with_metrics(data, stop=stop, on_malformed=answer, **job)
    print(result.summary(), flush=True)
    answer(result)


class ReplayProcess:
    """Replays a built-in dataset into a topic from a spawned child process.

    Args:
        dataset: a built-in dataset's name.
        table: a user's file instead: ``path``, ``schema`` (a dict), ``holdout``, ``name``.
        data_dir: the folder it is read from.
        bootstrap, topic: where it goes.
        kafka_conf: the Kafka client properties file (TLS, SASL), by path: the child reads it.
        epochs, rate, partitions: as ``streamtrain produce``'s options.
        resume: send only what the topic lacks (a resumed run's replay; see
            :class:`~producers.replay.Replay`).
        metrics_host, metrics_port: the producer's ``/metrics``.
        log_path: the child's output.
    """

    def __init__(
        self,
        *,
        dataset: str,
        data_dir: Path,
        bootstrap: str,
        topic: str,
        epochs: int,
        rate: float | None,
        partitions: int,
        metrics_host: str,
        metrics_port: int,
        log_path: Path,
        table: dict[str, Any] | None = None,
        resume: bool = False,
        kafka_conf: str | None = None,
    ) -> None:
        self.job: dict[str, Any] = {
            "dataset": dataset,
            "data_dir": str(data_dir),
            "table": table,
            "bootstrap": bootstrap,
            "topic": topic,
            "kafka_conf": kafka_conf,
            "epochs": epochs,
            "rate": rate,
            "partitions": partitions,
            "metrics_host": metrics_host,
            "metrics_port": metrics_port,
            "resume": resume,
        }
        self.log_path = log_path
        self.report: ReplayReport | None = None  # once the replay is over
        self.malformed: MalformedSoFar | None = None  # the rows it set aside so far (None: none)
        # SIGINT, as Ctrl-C would: the replay flushes what it handed to Kafka.
        self._child = ChildProcess(
            _replay,
            self.job,
            name="streamtrain-replay",
            what="the replay",
            log_path=log_path,
            stop_signal=signal.SIGINT,
        )

    @classmethod
    def for_run(
        cls,
        cfg: Any,
        *,
        table: dict[str, Any] | None,
        data_dir: Path,
        bootstrap: str,
        topic: str,
        out: Path,
        metrics_host: str,
    ) -> ReplayProcess:
        """The replay of a run's data (``cfg``: its :class:`~pipeline.jobs.run_config.RunConfig`),
        its output in ``out/producer.log``; a resumed run's sends what the topic lacks."""
        return cls(
            dataset=cfg.dataset,
            data_dir=data_dir,
            table=table,
            bootstrap=bootstrap,
            topic=topic,
            kafka_conf=cfg.kafka_conf,
            epochs=cfg.epochs,
            rate=cfg.rate,
            partitions=cfg.workers,
            metrics_host=metrics_host,
            metrics_port=cfg.producer_metrics_port,
            log_path=out / "producer.log",
            resume=cfg.resume,
        )

    @property
    def sent(self) -> int | None:
        """Records of the replay in the topic, once it is over: those Kafka acknowledged, and
        (resumed) those an earlier session's replay had sent."""
        return (
            self.report.records_sent + self.report.resumed_after
            if self.report is not None
            else None
        )

    def start(self) -> ReplayProcess:
        self._child.start()
        rate = self.job["rate"]
        what = self.job["table"]["path"] if self.job["table"] else self.job["dataset"]
        log.info(
            "replaying %s x%d into %s (%s)",
            what,
            self.job["epochs"],
            self.job["topic"],
            f"{rate:g}/s" if rate else "full speed",
        )
        return self

    def done(self) -> bool:
        """Whether the replay is over (then :attr:`report` says what it sent); raises if it
        failed. Takes in what it said of the rows it set aside (:attr:`malformed`)."""
        from producers.report import MalformedSoFar

        while self.report is None:
            if not self._child.ready():
                if self._child.exitcode not in (None, 0):
                    raise StreamtrainError(
                        f"The replay producer died (exit {self._child.exitcode}); "
                        f"see {self.log_path}."
                    )
                return False
            try:
                answer = self._child.receive()
            except EOFError:  # it exited without a report
                raise StreamtrainError(
                    f"The replay producer died (exit {self._child.exitcode}); see {self.log_path}."
                ) from None
            if isinstance(answer, MalformedSoFar):
                self.malformed = answer
                continue
            if isinstance(answer, ChildFailed):
                raise StreamtrainError(f"The replay producer failed: {answer.error}")
            if answer.send_errors:
                raise StreamtrainError(
                    f"The replay producer failed: {answer.send_errors} records were not "
                    f"acknowledged by Kafka (see {self.log_path})."
                )
            self.report = answer
        return True

    def stop(self) -> None:
        """Interrupt the replay (it flushes what it handed to Kafka) and wait for it."""
        self._child.stop()
