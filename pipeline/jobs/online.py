"""`streamtrain run`: replay a dataset into Kafka and train a model online from the stream.

Embedded by default: a Tansu broker, a replay producer (a process of its own), Spark
in local mode, the parameter server in this process. Every micro-batch is trained
exactly once across crashes, by :class:`~pipeline.train.driver.TrainDriver`.

:class:`Run` wires the stages and holds no protocol of its own: the replay
(:mod:`~pipeline.jobs.replay_process`), the query (:mod:`~pipeline.ingest.microbatch`),
the parameter server and the exactly-once driver (:mod:`~pipeline.train.driver`), the
metrics (:mod:`~pipeline.jobs.run_metrics`), the display and the report
(:mod:`~pipeline.jobs.report`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline import cluster, config
from pipeline.cluster import processes, scratch, security
from pipeline.errors import ConfigError, StreamtrainError
from pipeline.ingest import microbatch
from pipeline.ingest.kafka.release import Releaser
from pipeline.jobs import kafka_start, model_start, resume, run_record, run_serving, user_data
from pipeline.jobs.display import Display
from pipeline.jobs.rejects import REJECTED_SHARE, Rejects
from pipeline.jobs.replay_process import ReplayProcess
from pipeline.jobs.report import BATCHES_FILE, REPORT_FILE, History, RunReport
from pipeline.jobs.run_config import RunConfig
from pipeline.jobs.run_metrics import RunMetrics
from pipeline.observe import exposition
from pipeline.train import algorithms, checkpoint
from pipeline.train.driver import TrainDriver
from pipeline.train.evaluation import MIN_SCORED
from pipeline.train.ledger import check_ledger

log = logging.getLogger(__name__)

__all__ = ["Run", "RunConfig", "check_ledger", "run"]


class Run:
    """One online training run; :meth:`execute` runs it to the end and returns the report."""

    def __init__(self, cfg: RunConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        overrides: dict[str, Any] = (
            {}
            if cfg.communication_window is None
            else {algorithms.get(cfg.algorithm).window_setting: cfg.communication_window}
        )
        if cfg.sync_overlap:
            overrides["overlap"] = True
        self.algorithm = algorithms.get(
            cfg.algorithm,
            num_workers=cfg.workers,
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            **overrides,
        )
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.out = Path(cfg.out or Path("runs") / f"{cfg.name}-{stamp}").resolve()
        if cfg.bootstrap and not cfg.topic and not cfg.own_topic and not cfg.resume:
            # Its replay into a Kafka others use: a topic of its own, so that it trains its own
            # records alone and its stop rule counts them (run.json keeps it for a resume).
            self.cfg = cfg = dataclasses.replace(
                cfg, own_topic=_topic_name(f"streamtrain-{cfg.name}-{stamp}")
            )
        self.topic = cfg.topic or cfg.own_topic or f"streamtrain-{cfg.name}"
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
            until_accuracy=cfg.until_accuracy,
            started=self._started,
            rejects=Rejects(limit=REJECTED_SHARE if cfg.max_rejected is None else cfg.max_rejected),
        )
        self._failure: StreamtrainError | None = (
            None  # what stopped the query, raised once it stopped
        )
        self.display.trained = self._trained_total
        self._ready_at = 0.0
        self._cores = 1
        self._server: Any = None
        self._driver: TrainDriver | None = None
        self._evaluation: Any = None
        self._release: Releaser | None = None
        self._early_serving: Any = None  # a restarted run's model server, on its checkpoint
        self._recorded = False  # whether run.json holds this run's options

    def _until(self) -> bool:
        """Whether to stop: a reason was found, the records set aside passed --max-rejected, or
        the replay is over and all it sent is handled."""
        if self.display.stop_reason:
            return True
        over = self.replay is not None and self.replay.done()
        rejects = self.display.rejects
        if self.replay is not None:  # the rows it could not send, on /metrics as they come
            self.metrics.on_rejects(rejects.add_replay(self.replay.malformed))
        done = (
            self._driver.handled if self._driver is not None else 0
        )  # trained, or held out after a drift
        handled = over and done + self.history.rejected() >= (self.replay.sent or 0)  # type: ignore[union-attr]
        self._failure = rejects.verdict(final=handled)
        if self._failure is not None or handled:
            self.display.stop_reason = (
                "too many records rejected" if self._failure else "all produced records trained"
            )
        return self._failure is not None or handled

    def _trained_total(self) -> int:
        return self._driver.trained if self._driver is not None else 0

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
            )

            def prepare() -> None:
                # While the query starts (seconds of its source's set-up and planning): the
                # model, the parameter server, the workers' replicas. No batch runs before.
                spec, initial = probe.result()
                if probe.compiled() and model_start.use_compiled(self.algorithm, spec):
                    name = (
                        spec.optimizer.get("class_name")
                        if isinstance(spec.optimizer, dict)
                        else spec.optimizer
                    )
                    self.display.startup(
                        f"training with the model's own compile: optimizer {name}, loss {spec.loss}"
                    )
                if (
                    data.schema.regression
                ):  # its status lines show the error, not an accuracy it has none of
                    self.display.regression_loss = (
                        self.algorithm.loss if isinstance(self.algorithm.loss, str) else "loss"
                    )
                self.display.startup(
                    f"model described ({spec.size:,} weights); warming up {cfg.workers} workers"
                )
                handler, warm_up = self._start_training(
                    stack, spark, spec, data, prior or checkpoint.State(initial)
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
                    self._failure is not None
                ):  # the query stopped after its last commit: say why, in one line
                    raise self._failure
            except StreamtrainError:
                # What stopped it (an unreadable batch, its lag) reaches Prometheus.
                served.await_scrape()
                raise
            # Start-up: from the launch to the first trained micro-batch (Spark's session, the
            # broker, the workers' warm-up, the query's start, the batch); the warm-up's end
            # when no batch trained.
            startup_s = self.history.startup_s(self._started) or self._ready_at - self._started
            final_weights, _ = self._server.snapshot()
            ps_stats = self._server.stats()
            # A model that trained nothing, or too few held-out records, gets no score: a number
            # there would be read as the model's.
            final = (
                self._evaluation.score(final_weights)
                if self._trained_total() and self._evaluation.can_score
                else {}
            )
            self.metrics.on_final(final)
            self._evaluation.save_model(final_weights, self.out / "model.keras")
            # A run watched by Prometheus stays up for one more scrape, so its final
            # figures are recorded; an unwatched one does not wait.
            served.await_scrape()
        report = self._report(final, startup_s, ps_stats)
        report.draw(
            self.out,
            name=self.cfg.name,
            eval_every=self.cfg.eval_every,
            eval_records=len(self._evaluation.y),
        )
        (self.out / REPORT_FILE).write_text(json.dumps(report.to_dict(), indent=2, default=float))
        return report

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

    def _start_training(
        self, stack: contextlib.ExitStack, spark: Any, spec: Any, data: Any, state: checkpoint.State
    ) -> tuple[Any, Callable[[], None]]:
        """The parameter server (from ``state``), the exactly-once driver and the held-out
        evaluation, wired to this run; the handler the query's batches go to; and the
        warm-up of the workers."""
        from pipeline.jobs import run_drift
        from pipeline.train.evaluation import Evaluation
        from pipeline.train.handler import TrainHandler
        from pipeline.train.partition import ServerInfo
        from pipeline.train.server import parameter_server
        from pipeline.train.warmup import warm_up

        cfg = self.cfg
        # The model against the run's: the checkpoint's size, the record's fingerprint.
        checkpoint.check_fits(state, spec.size, self.out)
        if not self._recorded:
            run_record.write(self.out, dataclasses.asdict(cfg))
        run_record.describe_model(self.out, spec=spec, schema=data.schema, name=cfg.name)
        self._cores = int(spark.sparkContext.defaultParallelism)
        threads = cluster.task_threads(spark, cfg.workers)
        server = self._server = parameter_server(
            self.algorithm,
            spec,
            state.weights,
            host=cluster.driver_host(spark),
            port=self.settings.ps_port,
            shared_memory=self.settings.ps_shared_memory,
            on_request=self.metrics.on_ps_request,
            on_refusal=self.metrics.on_ps_refusal,
            on_event=self.metrics.on_ps_event,
            straggler_wait=_round_wait(cfg, self.settings),
            clock=state.clock,
            optimizer=state.optimizer,
            shards=cfg.ps_shards,
        )
        stack.enter_context(server)
        log.info(
            "parameter server at %s:%d%s",
            server.host,
            server.port,
            f" and {cfg.ps_shards - 1} more shards" if cfg.ps_shards > 1 else "",
        )
        self._driver = TrainDriver(
            server,
            state,
            folder=self.out,
            releaser=self._release,
            started=self._started,
            sync_slots=self._cores if self.algorithm.synchronous else 0,
            fault=self.settings.fault,
            on_row=self.display.on_row,
            on_skip=lambda _: self.metrics.skipped(),
            keep=cfg.keep_checkpoints,
        )
        serving = run_serving.start(
            stack, cfg, self.settings, self.out, spec, data.schema, server, self._early_serving
        )
        handler = TrainHandler(
            spec=spec,
            algorithm=algorithms.serialize(self.algorithm),
            server=ServerInfo.of(server, cfg.wire_dtype),
            job=uuid.uuid4().hex,
            threads=threads,
            seed=cfg.seed or 0,
            driver=self._driver,  # a replayed batch trains in the same order
        )
        test = data.load("test")
        if len(test.y) < MIN_SCORED:
            self.display.startup(
                f"held-out set too small to score ({len(test.y)} records, "
                f"fewer than {MIN_SCORED}): no held-out scores; "
                "pass --eval-data FILE or a larger --holdout"
            )
        n_eval = min(len(test.y), cfg.eval_max)
        self._evaluation = self.display.evaluation = Evaluation(
            spark,
            spec,
            schema=data.schema,
            x=test.x[:n_eval],
            y=test.y[:n_eval],
            job=handler.job,
            threads=threads,
            shards=cfg.workers,
        )
        stack.callback(self._evaluation.close)
        if cfg.divergence_check and len(test.y) >= MIN_SCORED:
            self._driver.watch_heldout(test.y[:n_eval], regression=data.schema.regression)
        run_drift.watch(
            self, handler=handler, schema=data.schema
        )  # after the held-out watch: it may replace it

        def warm() -> None:
            warm_up(
                spark,
                spec,
                handler.job,
                workers=cfg.workers,
                threads=threads,
                batch=self.algorithm.worker_batch_size,
                gradients=self.algorithm.pushes_gradients,
            )
            self._ready_at = time.monotonic()
            self.display.startup("workers warm")
            if serving is not None:
                self.display.startup(f"serving predictions at {serving.wait()}:predict")

        return handler, warm

    def _report(
        self, final: dict[str, float], startup_s: float, ps_stats: dict[str, Any]
    ) -> RunReport:
        assert self._driver is not None and self._driver.state is not None
        return RunReport.of_run(
            settings=self.cfg.report_settings(),
            algorithm=algorithms.serialize(self.algorithm),
            topic=self.topic,
            out=self.out,
            startup_s=startup_s,
            trained=self._trained_total(),
            history=self.history,
            stopped_because=self.display.stop_reason or "limit (--max-batches / --timeout)",
            final=final,
            ledger=self._driver.state.ledger,
            ps_stats=ps_stats,
            workers=self.cfg.workers,
            slots=self._cores,
            rejects=self.display.rejects,
            drifts=self._driver.drift.watch.found if self._driver.drift else [],
        )


def _round_wait(cfg: RunConfig, settings: config.Settings) -> float:
    """How long a synchronous round waits for a straggler (``STREAMTRAIN_ROUND_WAIT``). In
    local mode, unless set, it waits for every worker: they share one machine's cores, so a
    late one is jitter, not a slow host, and a round cut short steps on half its batch and
    lands the late gradient a round stale (``bench/ablation.py``: staleness costs records)."""
    if cfg.master.startswith("local") and "round_wait" not in settings.model_fields_set:
        return 0.0
    return settings.round_wait


def _topic_name(base: str) -> str:
    """A Kafka topic name, unique to this run, from ``base``.

    >>> _topic_name("streamtrain-my data-20261124")[:29]
    'streamtrain-my-data-20261124-'
    """
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{base}-{uuid.uuid4().hex[:6]}")[:200]


def run(cfg: RunConfig) -> RunReport:
    """Run ``cfg`` to the end; return the report (also written to ``<out>/report.json``)."""
    return Run(cfg).execute()
