"""`streamtrain run`: replay a dataset into Kafka and train a model online from the stream.

Embedded by default: a Tansu broker, a replay producer (a subprocess), Spark in
local mode, the parameter server in this process. Every micro-batch is trained
exactly once across crashes: after a batch, the center weights, the clock, the
batch id and the trained offset ranges go to ``<out>/state.npz`` in one atomic
write, before Spark commits the batch; a batch Spark replays after a crash is
skipped if the checkpoint already holds it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import algorithms, checkpoint, codec, config, metrics, stream
from pipeline.errors import ConfigError, DataError, StreamtrainError
from pipeline.model import ModelSpec
from pipeline.modelprobe import Probe

log = logging.getLogger("streamtrain.run")

DATASETS = ("mnist", "fashion-mnist", "higgs")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Settings of one run (the CLI's options)."""

    dataset: str = "mnist"
    algorithm: str = "sync"
    workers: int = 2
    batch_size: int = 128
    communication_window: int | None = None  # None: the algorithm's own
    epochs: int = 1
    rate: float | None = None
    until_accuracy: float | None = None
    max_batches: int | None = None
    timeout_s: float | None = None
    bootstrap: str | None = None
    topic: str | None = None
    master: str = "local[*]"
    model: str | None = None
    out: str | None = None
    resume: bool = False
    max_offsets_per_trigger: int = 20_000
    eval_every: int = 5
    eval_max: int = 10_000
    metrics_port: int = 0
    producer_metrics_port: int = 0
    data_dir: str | None = None
    seed: int | None = None

    def validate(self) -> None:
        if self.dataset not in DATASETS:
            raise ConfigError(f"Expected --dataset in {DATASETS}. Received: {self.dataset!r}")
        for name in ("workers", "batch_size", "communication_window", "epochs", "max_offsets_per_trigger", "eval_every"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"Expected --{name.replace('_', '-')} >= 1. Received: {value}")
        if self.until_accuracy is not None and not 0 < self.until_accuracy <= 1:
            raise ConfigError(f"Expected --until-accuracy in (0, 1]. Received: {self.until_accuracy}")
        if self.resume and not self.out:
            raise ConfigError("--resume needs the run's output folder.")


class Evaluation:
    """The held-out split, scored on the workers' replicas (the driver holds no TensorFlow).

    The raw records travel to the executors once, as a broadcast; each scoring is
    a Spark job of one task per worker, each task scoring every k-th record.
    """

    def __init__(self, spark: Any, spec: ModelSpec, *, schema: codec.Schema, x: np.ndarray, y: np.ndarray,
                 job: str, threads: int, shards: int) -> None:
        self.spark, self.spec, self.schema, self.y = spark, spec, schema, y
        self.job, self.threads, self.shards = job, threads, max(1, min(shards, len(y)))
        self._x = spark.sparkContext.broadcast(x)

    def predict(self, weights: np.ndarray) -> np.ndarray:
        """The model's outputs on the held-out records with ``weights``."""
        spec, schema, job, threads, shards, records = self.spec, self.schema, self.job, self.threads, self.shards, self._x

        def task(part: Any) -> Any:
            from pipeline.worker import predict

            for i in part:
                yield i, predict(spec, weights, schema.to_model_input(records.value[i::shards]), job=job,
                                 threads=threads)

        sc = self.spark.sparkContext
        sc.setJobDescription("streamtrain: score the held-out split")
        rows = sc.parallelize(range(shards), shards).mapPartitions(task).collect()
        first = rows[0][1]
        probs = np.empty((len(self.y), *first.shape[1:]), first.dtype)
        for i, part in rows:
            probs[i::shards] = part
        return probs

    def score(self, weights: np.ndarray) -> dict[str, float]:
        return scores(self.y, self.predict(weights))

    def save_model(self, weights: np.ndarray, path: Path) -> None:
        """Write the model with ``weights`` as a ``.keras`` file (built on a worker)."""
        spec = self.spec

        def task(_: Any) -> Any:
            from pipeline.worker import model_file

            yield model_file(spec, weights)

        sc = self.spark.sparkContext
        sc.setJobDescription("streamtrain: save the model")
        blob = sc.parallelize([0], 1).mapPartitions(task).collect()[0]
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(blob)
        os.replace(tmp, path)

    def close(self) -> None:
        self._x.destroy()


def scores(y: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """Accuracy of class probabilities ``probs`` against labels ``y``, and ROC AUC for two classes.

    >>> scores(np.array([0, 1, 1]), np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]))
    {'accuracy': 0.6666666666666666, 'auc': 1.0}
    """
    out = {"accuracy": float((probs.argmax(axis=1) == y).mean())}
    if probs.shape[1] == 2:
        out["auc"] = roc_auc(y, probs[:, 1])
    return out


def roc_auc(y: np.ndarray, score: np.ndarray) -> float:
    """ROC AUC from ranks (Mann-Whitney U), ties averaged.

    >>> roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.4, 0.35, 0.8]))
    0.75
    """
    # Average ranks of tied scores, as Mann-Whitney U needs.
    _, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2)[inverse]
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


class Run:
    """One online training run; :meth:`execute` runs it to the end and returns the report."""

    def __init__(self, cfg: RunConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        window = ({} if cfg.communication_window is None else
                  {algorithms.get(cfg.algorithm).window_setting: cfg.communication_window})
        self.algorithm = algorithms.get(cfg.algorithm, num_workers=cfg.workers, batch_size=cfg.batch_size,
                                        seed=cfg.seed, **window)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.out = Path(cfg.out or Path("runs") / f"{cfg.dataset}-{stamp}").resolve()
        self.topic = cfg.topic or f"streamtrain-{cfg.dataset}"
        self.meters = metrics.training_metrics()
        self._init_metrics()
        self.history: list[dict[str, Any]] = []
        self.state: checkpoint.State | None = None
        self.produced_target = 0
        self._producer: subprocess.Popen[str] | None = None
        self._producer_log: Any = None
        self._started = time.monotonic()
        self._first_batch_at: float | None = None
        self._ready_at = 0.0
        self._last_batch_at = 0.0
        self._stop_reason = ""
        self._eval_s = 0.0
        self._ps_stats: dict[str, Any] = {}
        self._clock_seen = 0
        self._cores = 1

    # --- pieces ---

    def _dataset(self) -> Any:
        from producers import datasets

        data_dir = Path(self.cfg.data_dir) if self.cfg.data_dir else config.data_dir()
        return datasets.get(self.cfg.dataset, data_dir=data_dir)

    def _start_producer(self, bootstrap: str) -> None:
        cmd = [sys.executable, "-m", "producers", self.cfg.dataset, "--topic", self.topic, "--bootstrap", bootstrap,
               "--epochs", str(self.cfg.epochs), "--partitions", str(self.cfg.workers), "--no-progress",
               "--metrics-port", str(self.cfg.producer_metrics_port)]
        if self.cfg.rate:
            cmd += ["--rate", str(self.cfg.rate)]
        if self.cfg.data_dir:
            cmd += ["--data-dir", self.cfg.data_dir]
        # Output goes to files, not pipes: nobody reads a pipe while the run streams.
        self._producer_log = open(self.out / "producer.log", "w+")  # noqa: SIM115
        self._producer = subprocess.Popen(cmd, stdout=self._producer_log, stderr=subprocess.STDOUT, text=True)
        log.info("replaying %s x%d into %s (%s)", self.cfg.dataset, self.cfg.epochs, self.topic,
                 f"{self.cfg.rate:g}/s" if self.cfg.rate else "full speed")

    def _producer_done(self) -> bool:
        """Whether the replay is over; learns how many records it sent, and fails the run
        if it failed."""
        proc = self._producer
        if proc is None or proc.poll() is None:
            return proc is None
        if not self.produced_target:
            self._producer_log.seek(0)
            text = self._producer_log.read()
            sent = re.search(r"^sent (\d+) records", text, re.M)
            if proc.returncode != 0 or sent is None:
                last = (text.strip().splitlines() or ["no output"])[-1]
                raise StreamtrainError(f"The replay producer failed (exit {proc.returncode}): {last}")
            self.produced_target = int(sent.group(1))
        return True

    # --- per batch, on the driver ---

    def skip(self, batch_id: int) -> bool:
        done = self.state is not None and batch_id <= self.state.last_batch_id
        if done:
            self.meters.batches_skipped.inc()
        return done

    def on_tasks(self, n: int) -> None:
        # Synchronous rounds wait for the tasks that run at once: at most one per core.
        if self.algorithm.synchronous:
            self._server.expect_workers(min(n, self._cores))

    def on_batch(self, info: stream.BatchInfo) -> None:
        assert self.state is not None
        server, evaluation = self._server, self._evaluation
        if self._first_batch_at is None:
            self._first_batch_at = info.started_at
        weights, clock, optimizer = server.checkpoint()
        self.state.weights, self.state.clock, self.state.last_batch_id = weights, clock, info.batch_id
        self.state.optimizer = optimizer
        self.state.ledger += [[info.batch_id, *r] for r in info.ranges]
        trained = sum(r.get("records", 0) for r in info.results)
        stal = [s for r in info.results for s in r.get("staleness", [])]
        preq_n = sum(r.get("preq_n", 0) for r in info.results)
        row: dict[str, Any] = {
            "batch_id": info.batch_id, "t": round(time.monotonic() - self._started, 3), "rows": info.rows,
            "trained": trained, "rejected": info.rejects, "batch_s": round(info.batch_s, 3), "lag": sum(info.lag.values()),
            "staleness_p50": float(np.percentile(stal, 50)) if stal else None,
            "staleness_p99": float(np.percentile(stal, 99)) if stal else None,
            "clock": clock,
            "compute_s": sum(r.get("compute_s", 0.0) for r in info.results),
            "exchange_s": sum(r.get("exchange_s", 0.0) for r in info.results),
        }
        if preq_n:
            row["prequential_accuracy"] = sum(r["preq_acc"] * r["preq_n"] for r in info.results if r.get("preq_n")) / preq_n
            row["prequential_loss"] = sum(r["preq_loss"] * r["preq_n"] for r in info.results if r.get("preq_n")) / preq_n
        if (len(self.history) + 1) % self.cfg.eval_every == 0:
            began = time.monotonic()
            row["heldout"] = evaluation.score(weights)
            self._eval_s += time.monotonic() - began
        # Streaming time so far, and the part of it spent scoring the held-out split here.
        row["t_stream"] = round(time.monotonic() - self._first_batch_at, 3)
        self._last_batch_at = time.monotonic()
        row["eval_s_total"] = round(self._eval_s, 3)
        self.history.append(row)
        self.state.extra = {"trained": self.state.extra.get("trained", 0) + trained}
        checkpoint.save(self.out, self.state)  # before Spark commits this batch
        self._record_metrics(info, row)
        self._print(row)
        held = row.get("heldout", {}).get("accuracy")
        if self.cfg.until_accuracy is not None and held is not None and held >= self.cfg.until_accuracy:
            self._stop_reason = f"held-out accuracy {held:.4f} reached --until-accuracy {self.cfg.until_accuracy}"

    def _init_metrics(self) -> None:
        # Every labelled series exists from the start at 0, so rates and alerts see a
        # first reject or a first exchange as a change rather than a new series.
        m, cfg = self.meters, self.cfg
        m.info.labels(cfg.dataset, cfg.algorithm, self.topic, str(cfg.workers)).set(1)
        # Not yet measured is NaN (a gap in a graph), not 0 (a loss of 0, a batch in 1970).
        for gauge in (m.freshness, m.prequential_loss, m.prequential_accuracy, m.heldout_accuracy, m.last_batch_time):
            gauge.set(float("nan"))
        m.records_ingested.labels(self.topic)
        m.records_trained.labels(self.topic)
        for reason in codec.REASONS:
            m.records_rejected.labels(reason)
        for activity in ("compute", "exchange"):
            m.worker_seconds.labels(activity)

    def _on_ps_request(self, op: str, seconds: float) -> None:
        self.meters.ps_request_duration.labels(op).observe(seconds)

    def _on_lag(self, lag: dict[str, int]) -> None:
        for tp, n in lag.items():
            topic, _, part = tp.rpartition("-")
            self.meters.consumer_lag.labels(topic, part).set(n)

    def _record_metrics(self, info: stream.BatchInfo, row: dict[str, Any]) -> None:
        m = self.meters
        m.records_ingested.labels(self.topic).inc(info.rows)
        m.records_trained.labels(self.topic).inc(row["trained"])
        for reason, n in info.rejects.items():
            m.records_rejected.labels(reason).inc(n)
        m.batches.inc()
        m.batch_duration.observe(info.batch_s)
        self._on_lag(info.lag)
        for r in info.results:
            for s in r.get("staleness", []):
                m.staleness.observe(s)
            if r.get("freshness_s"):
                m.freshness.set(r["freshness_s"][0])
        m.updates_applied.inc(max(0, row["clock"] - self._clock_seen))
        self._clock_seen = row["clock"]
        m.clock.set(row["clock"])
        m.last_batch_time.set_to_current_time()
        m.worker_seconds.labels("compute").inc(row["compute_s"])
        m.worker_seconds.labels("exchange").inc(row["exchange_s"])
        if "prequential_accuracy" in row:
            m.prequential_accuracy.set(row["prequential_accuracy"])
            m.prequential_loss.set(row["prequential_loss"])
        if "heldout" in row:
            m.heldout_accuracy.set(row["heldout"]["accuracy"])

    def _print(self, row: dict[str, Any]) -> None:
        elapsed = max(1e-9, time.monotonic() - (self._first_batch_at or self._started))
        total = self.state.extra.get("trained", 0) if self.state else 0
        here = self._trained_here()
        parts = [f"batch {row['batch_id']:>4}", f"trained {total:>8,}", f"{here / elapsed:>7,.0f}/s",
                 f"lag {row['lag']:>7,}"]
        if row["staleness_p50"] is not None:
            parts.append(f"staleness p50/p99 {row['staleness_p50']:.0f}/{row['staleness_p99']:.0f}")
        if "prequential_accuracy" in row:
            parts.append(f"prequential acc {row['prequential_accuracy']:.3f}")
        if "heldout" in row:
            parts.append("held-out " + " ".join(f"{k} {v:.4f}" for k, v in row["heldout"].items()))
        print(" | ".join(parts), flush=True)

    # --- the whole run ---

    def _until(self) -> bool:
        if self._stop_reason:
            return True
        # The end of the data: the producer is done and everything it sent is trained.
        done = self.state.extra.get("trained", 0) + self._rejected() if self.state is not None else 0
        if self._producer is not None and self._producer_done() and done >= self.produced_target:
            self._stop_reason = "all produced records trained"
            return True
        return False

    def _trained_here(self) -> int:
        """Records trained since this process started (a resumed run counts from its resume)."""
        return int(sum(b["trained"] for b in self.history))

    def _rejected(self) -> int:
        return int(sum(sum(r.get("rejected", {}).values()) for r in self.history))

    def execute(self) -> dict[str, Any]:
        from pipeline import spark as spark_mod
        from pipeline.kafka import EmbeddedBroker, client
        from pipeline.online import TrainHandler
        from pipeline.trainer import parameter_server
        from pipeline.worker import ServerInfo

        cfg = self.cfg
        prior = checkpoint.load(self.out) if cfg.resume else None
        if cfg.resume and prior is None:
            raise ConfigError(f"Nothing to resume in {self.out}: no {checkpoint.FILENAME} there.")
        if not cfg.resume and (self.out / checkpoint.FILENAME).exists():
            raise ConfigError(f"{self.out} holds a previous run; pass --resume to continue it, or another --out.")
        self.out.mkdir(parents=True, exist_ok=True)
        if cfg.bootstrap:
            bootstrap = client.parse_bootstrap(cfg.bootstrap)
            client.check_reachable(bootstrap)
        with contextlib.ExitStack() as stack:
            # Describing the model (a child process imports TensorFlow), starting the broker
            # and the replay, and starting Spark's JVM each take seconds: they overlap.
            probe = Probe(cfg.model, cfg.dataset, optimizer=self.algorithm.worker_optimizer, loss=self.algorithm.loss,
                          folder=Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="streamtrain-model-"))))
            stack.callback(probe.cancel)
            data = self._dataset()
            test = data.load("test")
            n_eval = min(len(test.y), cfg.eval_max)
            settings = config.settings()
            server_metrics = metrics.serve(self.meters.registry, host=settings.metrics_host, port=cfg.metrics_port)
            log.info("metrics at %s", server_metrics.url)

            stack.callback(server_metrics.stop)
            if not cfg.bootstrap:
                bootstrap = stack.enter_context(EmbeddedBroker(log_path=self.out / "broker.log")).bootstrap
                log.info("embedded Kafka at %s", bootstrap)
            client.ensure_topic(bootstrap, self.topic, partitions=cfg.workers)
            if not cfg.resume and not (cfg.topic and cfg.bootstrap):
                self._start_producer(bootstrap)
                stack.callback(self._stop_producer)

            spark = spark_mod.session(cfg.master, app=f"streamtrain-{cfg.dataset}")
            stack.callback(spark_mod.stop, spark)  # after a first run, builds the JVM's class archive
            spec, initial = probe.result()
            self.spec = spec
            cores = self._cores = int(spark.sparkContext.defaultParallelism)
            threads = max(1, cores // cfg.workers)
            self.state = prior or checkpoint.State(initial)
            host = "127.0.0.1" if cfg.master.startswith("local") else spark.conf.get("spark.driver.host")
            server = parameter_server(self.algorithm, spec, self.state.weights, host=host,
                                      shared_memory=settings.ps_shared_memory, on_request=self._on_ps_request)
            server.restore(self.state.weights, self.state.clock, self.state.optimizer)
            self.meters.clock.set(self.state.clock)
            self._clock_seen = self.state.clock
            stack.enter_context(server)
            handler = TrainHandler(
                spec=spec, algorithm=algorithms.serialize(self.algorithm),
                server=ServerInfo(server.host, server.port, server.secret), job=uuid.uuid4().hex,
                threads=threads, seed=cfg.seed or 0, driver=self,  # a replayed batch trains in the same order
            )
            evaluation = Evaluation(spark, spec, schema=data.schema, x=test.x[:n_eval], y=test.y[:n_eval],
                                    job=handler.job, threads=threads, shards=cfg.workers)
            stack.callback(evaluation.close)
            self._server, self._evaluation = server, evaluation
            job = stream.StreamJob(
                spark, bootstrap=bootstrap, topics=[self.topic], schema=data.schema, handler=handler,
                checkpoint=self.out / "spark-checkpoint", max_offsets_per_trigger=cfg.max_offsets_per_trigger,
                min_partitions=cfg.workers, on_lag=self._on_lag,
            )

            def prepare() -> None:
                warm_up(spark, spec, handler.job, workers=cfg.workers, threads=handler.threads,
                        batch=self.algorithm.worker_batch_size, gradients=self.algorithm.pushes_gradients)
                self._ready_at = time.monotonic()

            job.run(max_batches=cfg.max_batches, timeout_s=cfg.timeout_s, until=self._until, prepare=prepare)
            # Start-up: everything before the first micro-batch starts training (Spark's
            # session, the broker, the workers' warm-up, the query's start).
            startup_s = (self._first_batch_at or self._ready_at) - self._started
            final_weights, _ = server.snapshot()
            self._ps_stats = server.stats()
            final = evaluation.score(final_weights)
            evaluation.save_model(final_weights, self.out / "model.keras")
        report = self._report(final, startup_s)
        if self.history:
            from pipeline import plots

            try:
                plots.report_plots(self.history, self.out / "report.png",
                                   title=f"{cfg.dataset} with {cfg.algorithm}, {cfg.workers} workers ({self.out.name})")
                report["plots"] = str(self.out / "report.png")
            except Exception as e:  # the model and the report matter more than a picture
                log.warning("could not draw the report plots: %s: %s", type(e).__name__, e)
        (self.out / "report.json").write_text(json.dumps(report, indent=2, default=float))
        return report

    def _stop_producer(self) -> None:
        proc = self._producer
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()
        if self._producer_log is not None:
            self._producer_log.close()

    def _report(self, final: dict[str, float], startup_s: float) -> dict[str, Any]:
        assert self.state is not None
        trained = int(self.state.extra.get("trained", 0))
        here = self._trained_here()
        # Streaming time: from the first batch to the end of the last one; stopping the
        # query, the final evaluation and saving the model are not training.
        span = (self._last_batch_at - self._first_batch_at) if self._first_batch_at else 0.0
        return {
            "settings": dataclasses.asdict(self.cfg), "algorithm": algorithms.serialize(self.algorithm),
            "topic": self.topic, "out": str(self.out), "startup_s": round(startup_s, 2),
            "trained_records": trained, "trained_this_session": here, "rejected_records": self._rejected(),
            "train_seconds": round(span, 2), "records_per_s": round(here / span, 1) if span else 0.0,
            "records_per_s_excluding_eval": round(here / (span - self._eval_s), 1) if span > self._eval_s else 0.0,
            "stopped_because": self._stop_reason or "limit (--max-batches / --timeout)",
            "final": final, "batches": self.history, "ledger": self.state.ledger,
            # How workers reached the server (connections over shared memory: local mode),
            # and any request it refused.
            "parameter_server": {k: self._ps_stats.get(k) for k in ("ops", "shared_memory", "refused")},
        }


def warm_up(spark: Any, spec: ModelSpec, job: str, *, workers: int, threads: int, batch: int,
            gradients: bool = False) -> None:
    """Import TensorFlow, build the replica and trace its functions in each executor
    Python worker before the first batch, so that it trains at full speed."""

    def build(_: Any) -> Any:
        began = time.monotonic()
        from pipeline.worker import init_tensorflow, replica

        init_tensorflow(threads)
        imported = time.monotonic()
        _, fresh = replica(spec, job=job, threads=threads, prime_batch=batch, gradients=gradients)
        built = time.monotonic()
        if not fresh:
            time.sleep(0.5)  # hold the slot, so each task lands in its own Python worker
        yield os.getpid(), imported - began, built - imported

    started = time.monotonic()
    sc = spark.sparkContext
    sc.setJobDescription("streamtrain: warm up the workers")
    done = sc.parallelize(range(workers), workers).mapPartitions(build).collect()
    log.info("replicas ready in %d worker processes in %.1f s (TensorFlow import %s s, build and trace %s s)",
             len({pid for pid, _, _ in done}), time.monotonic() - started,
             "/".join(f"{i:.1f}" for _, i, _ in done), "/".join(f"{b:.1f}" for _, _, b in done))


def check_ledger(ledger: list[list[Any]]) -> dict[tuple[str, int], int]:
    """Verify that trained ranges chain with no gap and no overlap per partition; return the ends.

    >>> check_ledger([[0, "t", 0, 0, 5], [1, "t", 0, 5, 9]])
    {('t', 0): 9}
    >>> check_ledger([[0, "t", 0, 0, 5], [1, "t", 0, 4, 9]])
    Traceback (most recent call last):
    ...
    pipeline.errors.DataError: ledger: t-0 batch 1 starts at 4 but the previous range ended at 5
    """
    ends: dict[tuple[str, int], int] = {}
    for batch_id, topic, part, start, end in ledger:
        key = (topic, int(part))
        if key in ends and start != ends[key]:
            raise DataError(f"ledger: {topic}-{part} batch {batch_id} starts at {start} "
                            f"but the previous range ended at {ends[key]}")
        ends[key] = end
    return ends


def run(cfg: RunConfig) -> dict[str, Any]:
    """Run ``cfg`` to the end; return the report (also written to ``<out>/report.json``)."""
    return Run(cfg).execute()
