"""A run's training half, wired: the parameter server, the exactly-once driver, the held-out
evaluation, the handler the query's batches go to and the workers' warm-up; at the end, the
final score and the saved model.

:class:`~pipeline.jobs.online.Run` holds one :class:`RunTraining` and starts it while the
query starts (its ``prepare``): no batch runs before it is ready.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline import cluster, config
from pipeline.ingest.kafka.release import Releaser
from pipeline.jobs import model_start, run_record, run_serving
from pipeline.jobs.display import Display
from pipeline.jobs.run_config import TABLE_LEARNING_RATE, RunConfig
from pipeline.jobs.run_metrics import RunMetrics
from pipeline.train import algorithms, checkpoint
from pipeline.train.driver import TrainDriver
from pipeline.train.evaluation import MIN_SCORED
from pipeline.train.probe import Probe

log = logging.getLogger(__name__)


class RunTraining:
    """The training side of one run: built with the run, started once Spark and the model's
    description are ready (:meth:`start`), read by the run's stop rule and its report.

    Args:
        cfg: the run's settings.
        algorithm: the run's algorithm (its loss set for a regression).
        out: the run's folder.
        settings: the process's settings (ports, shared memory, the fault hook).
        metrics, display: where the training's figures and start-up lines go.
        started: ``time.monotonic()`` when the run started.
    """

    def __init__(
        self,
        cfg: RunConfig,
        algorithm: algorithms.Algorithm,
        *,
        out: Path,
        settings: config.Settings,
        metrics: RunMetrics,
        display: Display,
        started: float,
    ) -> None:
        self.cfg, self.algorithm, self.out, self.settings = cfg, algorithm, out, settings
        self.metrics, self.display, self.started = metrics, display, started
        self.ready_at = 0.0  # when the workers were warm
        self.cores = 1  # Spark's task slots
        self.server: Any = None
        self.rows: Any = None  # the ID tables' row servers
        self.driver: TrainDriver | None = None
        self.evaluation: Any = None

    @property
    def trained(self) -> int:
        """Records the checkpoint says the run trained, across resumes (0 before the start)."""
        return self.driver.trained if self.driver is not None else 0

    @property
    def handled(self) -> int:
        """Records trained, or held out after a drift, across resumes (0 before the start)."""
        return self.driver.handled if self.driver is not None else 0

    def start(
        self,
        stack: contextlib.ExitStack,
        spark: Any,
        probe: Probe,
        data: Any,
        prior: checkpoint.State | None,
        *,
        recorded: bool,
        releaser: Releaser | None,
        early_serving: Any,
    ) -> tuple[Any, Callable[[], None]]:
        """Once the model is described (``probe``): say how it trains, then start the server
        (from ``prior``, else the model's initial weights), the driver and the evaluation.

        Returns:
            The handler the query's batches go to, and the workers' warm-up (to call once the
            query uses the handler).
        """
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
            f"model described ({spec.size:,} weights); warming up {self.cfg.workers} workers"
        )
        return self._start_training(
            stack,
            spark,
            spec,
            data,
            prior or checkpoint.State(initial),
            recorded=recorded,
            releaser=releaser,
            early_serving=early_serving,
        )

    def _start_training(
        self,
        stack: contextlib.ExitStack,
        spark: Any,
        spec: Any,
        data: Any,
        state: checkpoint.State,
        *,
        recorded: bool,
        releaser: Releaser | None,
        early_serving: Any,
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
        if not recorded:
            run_record.write(self.out, dataclasses.asdict(cfg))
        run_record.describe_model(self.out, spec=spec, schema=data.schema, name=cfg.name)
        self.cores = int(spark.sparkContext.defaultParallelism)
        threads = cluster.task_threads(spark, cfg.workers)
        server = self.server = parameter_server(
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
        rows = self.rows = _row_servers(
            cfg, data.schema, server, state, self.out, self.metrics, stack
        )
        log.info(
            "parameter server at %s:%d%s",
            server.host,
            server.port,
            f" and {cfg.ps_shards - 1} more shards" if cfg.ps_shards > 1 else "",
        )
        self.driver = TrainDriver(
            server,
            state,
            folder=self.out,
            releaser=releaser,
            started=self.started,
            sync_slots=self.cores if self.algorithm.synchronous else 0,
            fault=self.settings.fault,
            on_row=self.display.on_row,
            on_skip=lambda _: self.metrics.skipped(),
            keep=cfg.keep_checkpoints,
        )
        self.driver.rows = rows
        serving = run_serving.start(
            stack, cfg, self.settings, self.out, spec, data.schema, server, early_serving, rows
        )
        handler = TrainHandler(
            spec=spec,
            algorithm=algorithms.serialize(self.algorithm),
            server=ServerInfo.of(server, cfg.wire_dtype, rows),
            job=uuid.uuid4().hex,
            threads=threads,
            seed=cfg.seed or 0,
            driver=self.driver,  # a replayed batch trains in the same order
        )
        test = data.load("test")
        if len(test.y) < MIN_SCORED:
            self.display.startup(
                f"held-out set too small to score ({len(test.y)} records, "
                f"fewer than {MIN_SCORED}): no held-out scores; "
                "pass --eval-data FILE or a larger --holdout"
            )
        n_eval = min(len(test.y), cfg.eval_max)
        self.evaluation = self.display.evaluation = Evaluation(
            spark,
            spec,
            schema=data.schema,
            x=test.x[:n_eval],
            y=test.y[:n_eval],
            job=handler.job,
            threads=threads,
            shards=cfg.workers,
        )
        self.evaluation.server = handler.server
        stack.callback(self.evaluation.close)
        if cfg.divergence_check and len(test.y) >= MIN_SCORED:
            self.driver.watch_heldout(test.y[:n_eval], regression=data.schema.regression)
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
            self.ready_at = time.monotonic()
            self.display.startup("workers warm")
            if serving is not None:
                self.display.startup(f"serving predictions at {serving.wait()}:predict")

        return handler, warm

    def finish(self) -> tuple[dict[str, float], dict[str, Any]]:
        """The final held-out scores (on /metrics too) and the server's figures; the model
        saved as ``model.keras`` in the run's folder."""
        final_weights, _ = self.server.snapshot()
        ps_stats = self.server.stats()
        # A model that trained nothing, or too few held-out records, gets no score: a number
        # there would be read as the model's.
        final = (
            self.evaluation.score(final_weights)
            if self.trained and self.evaluation.can_score
            else {}
        )
        self.metrics.on_final(final)
        self.evaluation.save_model(final_weights, self.out / "model.keras")
        return final, ps_stats


def _row_servers(
    cfg: RunConfig,
    schema: Any,
    server: Any,
    state: checkpoint.State,
    out: Any,
    metrics: Any,
    stack: contextlib.ExitStack,
) -> Any:
    """The row servers of a table's ID features (None without any), started (each shard in
    a process of its own, stopped by ``stack``) and restored from the checkpoint's tables."""
    table = getattr(schema, "table", None)
    if table is None or not table.ids:
        return None
    from pipeline.train import table_store
    from pipeline.train.row_servers import RowServers, specs_of

    rows = RowServers(
        specs_of(table, cfg.seed or 0),
        secret=server.secret,
        host=server.host,
        shards=cfg.ps_shards,
        on_request=metrics.on_ps_request,
        processes=True,
    )
    stack.enter_context(rows)
    table_store.restore(out, rows, state.extra.get("tables"))
    return rows


def algorithm_of(cfg: RunConfig) -> algorithms.Algorithm:
    """The run's algorithm, from its options (``--communication-window`` under the
    algorithm's own name for it, ``--sync-overlap``)."""
    overrides: dict[str, Any] = (
        {}
        if cfg.communication_window is None
        else {algorithms.get(cfg.algorithm).window_setting: cfg.communication_window}
    )
    if cfg.sync_overlap:
        overrides["overlap"] = True
    if cfg.default_table_model:
        overrides["worker_optimizer"] = {
            "class_name": "Adam",
            "config": {"learning_rate": TABLE_LEARNING_RATE},
        }
    return algorithms.get(
        cfg.algorithm,
        num_workers=cfg.workers,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        **overrides,
    )


def _round_wait(cfg: RunConfig, settings: config.Settings) -> float:
    """How long a synchronous round waits for a straggler (``STREAMTRAIN_ROUND_WAIT``). In
    local mode, unless set, it waits for every worker: they share one machine's cores, so a
    late one is jitter, not a slow host, and a round cut short steps on half its batch and
    lands the late gradient a round stale (``bench/ablation.py``: staleness costs records)."""
    if cfg.master.startswith("local") and "round_wait" not in settings.model_fields_set:
        return 0.0
    return settings.round_wait
