"""`streamtrain run`: replay a dataset into Kafka and train a model online from the stream.

Embedded by default: a Tansu broker, a replay producer (a process of its own), Spark
in local mode, the parameter server in this process. Every micro-batch is trained
exactly once across crashes, by :class:`~pipeline.train.driver.TrainDriver`.

:class:`Run` wires the stages and holds no protocol of its own: the replay
(:mod:`~pipeline.jobs.replay_process`), the query (:mod:`~pipeline.ingest.microbatch`),
the parameter server and the exactly-once driver (:mod:`~pipeline.train.driver`, started by
:mod:`~pipeline.jobs.run_training`), the metrics (:mod:`~pipeline.jobs.run_metrics`), the
display, the stop rule and the report (:mod:`~pipeline.jobs.run_end`,
:mod:`~pipeline.jobs.report`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from pipeline import cluster, config
from pipeline.cluster import processes, scratch, security
from pipeline.errors import ConfigError, StreamtrainError
from pipeline.ingest import microbatch
from pipeline.ingest.kafka.release import Releaser
from pipeline.jobs import (
    kafka_start,
    model_start,
    resume,
    run_checks,
    run_record,
    run_serving,
    run_training,
    user_data,
)
from pipeline.jobs.display import Display
from pipeline.jobs.rejects import REJECTED_SHARE, Rejects
from pipeline.jobs.replay_process import ReplayProcess
from pipeline.jobs.report import BATCHES_FILE, History, RunReport
from pipeline.jobs.run_config import RunConfig
from pipeline.jobs.run_end import RunEnd
from pipeline.jobs.run_metrics import RunMetrics
from pipeline.jobs.run_training import RunTraining
from pipeline.observe import exposition
from pipeline.train import checkpoint
from pipeline.train.ledger import check_ledger

log = logging.getLogger(__name__)

__all__ = ["Run", "RunConfig", "check_ledger", "run"]


class Run:
    """One online training run; :meth:`execute` runs it to the end and returns the report."""

    def __init__(self, cfg: RunConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.algorithm = run_training.algorithm_of(cfg)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.out = Path(cfg.out or Path("runs") / f"{cfg.name}-{stamp}").resolve()
        if cfg.bootstrap and not cfg.topic and not cfg.own_topic and not cfg.resume:
            # Its replay into a Kafka others use: a topic of its own, so that it trains its own
            # records alone and its stop rule counts them (run.json keeps it for a resume).
            self.cfg = cfg = dataclasses.replace(
                cfg, own_topic=_topic_name(f"streamtrain-{cfg.name}-{stamp}")
            )
        if cfg.source == "auto":
            # Resolved before the run is recorded: a resume reads on with the source its
            # query's checkpoint was written by, whatever auto means by then.
            self.cfg = cfg = dataclasses.replace(cfg, source=run_checks.source_of(cfg))
        self.topic = cfg.topic or cfg.own_topic or f"streamtrain-{cfg.name}"
        if cfg.resume and cfg.default_table_model:
            # The default table model keeps the optimizer its run started with (runs from
            # before TABLE_LEARNING_RATE trained at Keras's default): the model's fingerprint,
            # which a resume checks, includes it.
            recorded = run_record.recorded_optimizer(self.out)
            if recorded is not None:
                self.algorithm.worker_optimizer = recorded
        self.metrics = RunMetrics(
            dataset=cfg.name, algorithm=cfg.algorithm, topic=self.topic, workers=cfg.workers
        )
        self.history = History(path=self.out / BATCHES_FILE)
        self.settings = config.settings()
        self.replay: ReplayProcess | None = None
        self._started = time.monotonic()
        self.display = Display(
            history=self.history,
            metrics=self.metrics,
            eval_every=cfg.eval_every,
            eval_share=cfg.eval_share,
            freshness_target_s=cfg.freshness_target_s,
            # The run's own replay sends flat out unless rated: behind by design, not news.
            judge_pace=bool(cfg.topic and cfg.bootstrap) or cfg.rate is not None,
            until_accuracy=cfg.until_accuracy,
            started=self._started,
            rejects=Rejects(limit=REJECTED_SHARE if cfg.max_rejected is None else cfg.max_rejected),
        )
        #: The server, the driver and the evaluation, started while the query starts.
        self.training = RunTraining(
            cfg,
            self.algorithm,
            out=self.out,
            settings=self.settings,
            metrics=self.metrics,
            display=self.display,
            started=self._started,
        )
        #: The stop rule, what stopped the run, and its report.
        self.end = RunEnd(
            cfg,
            self.algorithm,
            topic=self.topic,
            out=self.out,
            history=self.history,
            display=self.display,
            metrics=self.metrics,
            training=self.training,
        )
        self.display.trained = self._trained_total
        self._release: Releaser | None = None
        self._early_serving: Any = None  # a restarted run's model server, on its checkpoint
        self._recorded = False  # whether run.json holds this run's options

    def _until(self) -> bool:
        """Whether to stop (:meth:`~pipeline.jobs.run_end.RunEnd.until`)."""
        return self.end.until(self.replay)

    def _trained_total(self) -> int:
        return self.training.trained

    # --- the whole run ---

    def execute(self) -> RunReport:
        # Every temporary file of the run and its processes (TensorFlow's traced functions,
        # Spark's, the zygote's) in one folder, removed at the end, or by a later run after a kill.
        with scratch.scratch():
            return self._execute_in_scratch()

    def _execute_in_scratch(self) -> RunReport:
        created = not self.out.exists()
        try:
            with contextlib.ExitStack() as held:  # the folder locked before its checkpoint is read
                if not created:
                    held.enter_context(checkpoint.lock(self.out))
                prior = resume.check_out(self.cfg, self.out)
                if (
                    prior is not None
                ):  # before /metrics serves: a first scrape reads the run's totals
                    self.metrics.restore(prior, self.out)
                data = user_data.resolve(
                    self.cfg, self._data_dir()
                )  # its files and schema, before anything starts
                if data.schema.regression:
                    self.algorithm.loss = "mean_squared_error"
                resuming = resume.describe(prior, self.out / "spark-checkpoint")
                self.display.startup(
                    f"{self.cfg.name} found; {resuming}starting Kafka, the replay, Spark and "
                    "the model in parallel"
                )
                self.out.mkdir(parents=True, exist_ok=True)
                if created:
                    held.enter_context(checkpoint.lock(self.out))
                # A folder older than records gets one once its checkpoint fits the model given.
                self._recorded = not self.cfg.resume or run_record.read(self.out) is not None
                if self._recorded:
                    run_record.write(self.out, dataclasses.asdict(self.cfg))
                return self._execute(prior, data)
        except ConfigError:
            # A model that fails to build (found once it is built, in parallel with the
            # start-up) leaves no folder behind, as a bad option found earlier does.
            if created and not (self.out / checkpoint.FILENAME).exists():
                shutil.rmtree(self.out, ignore_errors=True)
            raise

    def _execute(self, prior: checkpoint.State | None, data: Any) -> RunReport:
        cfg = self.cfg
        with contextlib.ExitStack() as stack:
            # Importing TensorFlow (in the zygote, which then forks the model's describer and,
            # in local mode, Spark's Python workers), starting the broker and the replay, and
            # starting Spark's JVM each take seconds: they overlap.
            # A restarted run serves its checkpoint before anything else starts (Spark, the
            # workers).
            self._early_serving = run_serving.start_early(
                stack, cfg, self.settings, self.out, prior
            )
            zygote = model_start.start_zygote(stack, self.out) if self.settings.preload else None
            probe = model_start.describe(cfg, self.algorithm, data.schema, stack, zygote)
            served = exposition.serve(
                self.metrics.meters.registry, host=self.settings.metrics_host, port=cfg.metrics_port
            )
            log.info("metrics at %s", served.url)
            stack.callback(served.stop)
            bootstrap = self._start_broker_and_replay(stack, data)
            master, short = cluster.local_slots(cfg.master, cfg.workers, os.cpu_count() or 1)
            if short:
                log.warning("%s", short)
            spark = cluster.session(
                master,
                app=f"streamtrain-{cfg.name}",
                conf=security.spark_conf(cfg.master, cfg.spark_conf),
                zygote=zygote if master.startswith("local") else None,
                local_ip=self.settings.spark_local_ip,
                executor_wait_s=self.settings.executor_wait_s,
                source=cfg.source,
            )
            stack.callback(cluster.stop, spark)  # after a first run, builds the JVM's class archive
            stack.enter_context(
                processes.stop_gracefully(self.display.stop_requested)
            )  # over PySpark's SIGINT
            self.display.startup(
                f"Spark ready ({master}, {spark.sparkContext.defaultParallelism} task slots); "
                "starting the query"
            )
            job = microbatch.StreamJob(
                spark,
                bootstrap=bootstrap,
                topics=[self.topic],
                schema=data.schema,
                sizing=cfg.sizing,
                checkpoint=self.out / "spark-checkpoint",
                max_offsets_per_trigger=cfg.max_offsets_per_trigger,
                min_partitions=cfg.workers,
                on_lag=self.metrics.on_lag,
                isolation_level=cfg.isolation_level,
                on_unreadable=self.metrics.on_unreadable,
                on_poison=cfg.on_poison,
                kafka_conf=cfg.kafka_conf,
                source=cfg.source,
            )

            def prepare() -> None:
                # While the query starts (seconds of its source's set-up and planning): the
                # model, the parameter server, the workers' replicas. No batch runs before.
                handler, warm_up = self.training.start(
                    stack,
                    spark,
                    probe,
                    data,
                    prior,
                    recorded=self._recorded,
                    releaser=self._release,
                    early_serving=self._early_serving,
                )
                job.use(handler)
                warm_up()

            try:
                job.run(
                    max_batches=cfg.max_batches,
                    timeout_s=cfg.timeout_s,
                    until=self._until,
                    prepare=prepare,
                )
                if (
                    self.end.failure is not None
                ):  # the query stopped after its last commit: say why, in one line
                    raise self.end.failure
            except StreamtrainError:
                # What stopped it (an unreadable batch, its lag) reaches Prometheus.
                served.await_scrape()
                raise
            # Start-up: from the launch to the first trained micro-batch (Spark's session, the
            # broker, the workers' warm-up, the query's start, the batch); the warm-up's end
            # when no batch trained.
            startup_s = (
                self.history.startup_s(self._started) or self.training.ready_at - self._started
            )
            final, ps_stats = self.training.finish()
            # A run watched by Prometheus stays up for one more scrape, so its final
            # figures are recorded; an unwatched one does not wait.
            served.await_scrape()
        return self.end.report(final, startup_s, ps_stats)

    def _data_dir(self) -> Path:
        return Path(self.cfg.data_dir) if self.cfg.data_dir else config.data_dir()

    def _start_broker_and_replay(self, stack: contextlib.ExitStack, data: Any) -> str:
        """Kafka (the given one, or an embedded broker), the topic, and the replay into it."""
        kafka = kafka_start.start(
            stack,
            self.cfg,
            out=self.out,
            topic=self.topic,
            display=self.display,
            replay_job=user_data.replay_job(data),
            data_dir=self._data_dir(),
            metrics_host=self.settings.metrics_host,
        )
        self._release, self.replay = kafka.releaser, kafka.replay
        return kafka.bootstrap


def _topic_name(base: str) -> str:
    """A Kafka topic name, unique to this run, from ``base``.

    >>> _topic_name("streamtrain-my data-20261124")[:29]
    'streamtrain-my-data-20261124-'
    """
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{base}-{uuid.uuid4().hex[:6]}")[:200]


def run(cfg: RunConfig) -> RunReport:
    """Run ``cfg`` to the end; return the report (also written to ``<out>/report.json``)."""
    return Run(cfg).execute()
