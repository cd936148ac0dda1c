"""The run's replay producer, in a process of its own so that sending never competes with
the driver's threads; it reports what it sent as data, not as a line to parse."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

from pipeline.errors import StreamtrainError

log = logging.getLogger("pipeline.jobs.online")


class ReplayProcess:
    """Replays a built-in dataset into a topic from a spawned child process.

    Args:
        dataset: a built-in dataset's name.
        data_dir: the folder it is read from.
        bootstrap, topic: where it goes.
        epochs, rate, partitions: as ``streamtrain produce``'s options.
        metrics_host, metrics_port: the producer's ``/metrics``.
        log_path: the child's output.
    """

    def __init__(self, *, dataset: str, data_dir: Path, bootstrap: str, topic: str, epochs: int,
                 rate: float | None, partitions: int, metrics_host: str, metrics_port: int, log_path: Path) -> None:
        self.job: dict[str, Any] = {
            "dataset": dataset, "data_dir": str(data_dir), "bootstrap": bootstrap, "topic": topic,
            "epochs": epochs, "rate": rate, "partitions": partitions, "metrics_host": metrics_host,
            "metrics_port": metrics_port, "parent": os.getpid(),
        }
        self.log_path = log_path
        self.sent: int | None = None  # records Kafka acknowledged, once the replay is over
        self._process: Any = None
        self._report: Any = None

    def start(self) -> ReplayProcess:
        from producers.replay import replay_in_child

        # spawn, not fork: this process holds Spark's JVM gateway, threads and sockets.
        ctx = multiprocessing.get_context("spawn")
        self._report, child_end = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=replay_in_child, args=(self.job, child_end, str(self.log_path)),
                                    name="streamtrain-replay", daemon=True)
        self._process.start()
        child_end.close()
        rate = self.job["rate"]
        log.info("replaying %s x%d into %s (%s)", self.job["dataset"], self.job["epochs"], self.job["topic"],
                 f"{rate:g}/s" if rate else "full speed")
        return self

    def done(self) -> bool:
        """Whether the replay is over (then :attr:`sent` says how many records it sent);
        raises if it failed."""
        if self.sent is not None:
            return True
        if self._process is None or not self._report.poll():
            if self._process is not None and self._process.exitcode not in (None, 0):
                raise StreamtrainError(f"The replay producer died (exit {self._process.exitcode}); "
                                       f"see {self.log_path}.")
            return False
        try:
            report = self._report.recv()
        except EOFError:  # it exited without a report
            self._process.join(5)
            raise StreamtrainError(f"The replay producer died (exit {self._process.exitcode}); "
                                   f"see {self.log_path}.") from None
        if "error" in report:
            raise StreamtrainError(f"The replay producer failed: {report['error']}")
        if report["send_errors"]:
            raise StreamtrainError(f"The replay producer failed: {report['send_errors']} records were not "
                                   f"acknowledged by Kafka (see {self.log_path}).")
        self.sent = int(report["records_sent"])
        return True

    def stop(self) -> None:
        """Interrupt the replay (it flushes what it handed to Kafka) and wait for it."""
        proc = self._process
        if proc is not None and proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGINT)
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        if self._report is not None:
            self._report.close()
