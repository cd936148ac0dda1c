"""``streamtrain predict``: the predict stream's wiring (Spark, the query, its figures)."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

from pipeline import cluster, codec
from pipeline.errors import ConfigError
from pipeline.ingest import microbatch
from pipeline.ingest.kafka import client, conf
from pipeline.observe import exposition, metrics
from pipeline.serve.predictor import read_description
from pipeline.serve.stream import PredictHandler, job_id
from pipeline.train import checkpoint

log = logging.getLogger(__name__)


@dataclasses.dataclass
class PredictConfig:
    """The options of ``streamtrain predict`` (see its ``--help``)."""

    run_dir: str
    topic: str
    bootstrap: str
    kafka_conf: str | None = None  # a Kafka client properties file (TLS, SASL), by path
    output_topic: str | None = None
    input_format: str = "wire"  # or "json": each record one JSON instance
    checkpoint: str | None = None
    master: str = "local[*]"
    max_batches: int | None = None
    timeout_s: float | None = None
    available_now: bool = False
    max_offsets_per_trigger: int = 20_000
    metrics_port: int | None = None

    def validate(self) -> None:
        folder = Path(self.run_dir)
        read_description(folder)  # a clear error for a folder that is no run
        if not (folder / checkpoint.FILENAME).is_file():
            raise ConfigError(
                f"Expected a checkpoint ({checkpoint.FILENAME}) in {folder}: the run has not "
                "trained a micro-batch yet. Wait for one, or pass another run's folder."
            )
        if self.output_topic == self.topic:
            raise ConfigError(
                f"Expected --output-topic to differ from --topic ({self.topic}): predictions "
                "written into the input would be read back as records."
            )
        if self.input_format not in ("wire", "json"):
            raise ConfigError(
                f"Expected --input-format wire or json. Received: {self.input_format!r}"
            )
        if self.max_offsets_per_trigger < 1:
            raise ConfigError(
                f"Expected --max-offsets-per-trigger >= 1. Received: {self.max_offsets_per_trigger}"
            )


@dataclasses.dataclass
class PredictSummary:
    batches: int
    written: int
    output_topic: str
    newest_version: int

    def summary(self) -> str:
        return (
            f"wrote {self.written:,} predictions to {self.output_topic} in {self.batches} "
            f"micro-batches (newest weights: version {self.newest_version})"
        )


def run(cfg: PredictConfig) -> PredictSummary:
    """Score ``cfg.topic`` into the output topic until stopped (or drained, or a limit)."""
    from pipeline import config

    cfg.validate()
    folder = Path(cfg.run_dir).resolve()
    name, spec, schema = read_description(folder)
    if cfg.input_format == "json":
        schema = codec.json_instances(schema)
    output = cfg.output_topic or f"{cfg.topic}.predictions"
    secured = conf.load(cfg.kafka_conf)
    client.check_reachable(
        cfg.bootstrap, conf=secured
    )  # a refused password: one line, before Spark starts
    partitions = client.partitions_for(cfg.bootstrap, cfg.topic, conf=secured)
    if not partitions:
        raise ConfigError(
            f"Expected topic {cfg.topic} at {cfg.bootstrap}. It does not exist; produce into it "
            "first."
        )
    client.ensure_topic(cfg.bootstrap, output, partitions=len(partitions), conf=secured)
    meters = metrics.serving_metrics(name)
    served = None
    if cfg.metrics_port is not None:
        served = exposition.serve(
            meters.registry, host=config.settings().metrics_host, port=cfg.metrics_port
        )
        log.info("metrics at %s", served.url)
    figures = {"batches": 0, "written": 0, "version": -1}

    def on_written(n: int, version: int) -> None:
        figures["batches"] += 1
        figures["written"] += n
        figures["version"] = max(figures["version"], version)
        meters.predictions_written.labels(output).inc(n)
        print(
            f"batch {figures['batches']}: {n:,} predictions (weights version {version}) -> "
            f"{output}",
            flush=True,
        )

    spark = cluster.session(cfg.master, app=f"streamtrain-predict-{cfg.topic}")
    try:
        handler = PredictHandler(
            run_dir=str(folder),
            spec=spec,
            bootstrap=cfg.bootstrap,
            output_topic=output,
            kafka_conf=cfg.kafka_conf,
            job=job_id(str(folder)),
            threads=cluster.task_threads(spark, len(partitions)),
            on_written=on_written,
        )
        job = microbatch.StreamJob(
            spark,
            bootstrap=cfg.bootstrap,
            topics=[cfg.topic],
            schema=schema,
            handler=handler,
            checkpoint=cfg.checkpoint or folder / f"predict-{cfg.topic}",
            available_now=cfg.available_now,
            max_offsets_per_trigger=cfg.max_offsets_per_trigger,
            dead_letter_topic=f"{output}.dlq",
            kafka_conf=cfg.kafka_conf,
        )
        started = time.monotonic()
        job.run(max_batches=cfg.max_batches, timeout_s=cfg.timeout_s)
        log.info("predict stream stopped after %.1f s", time.monotonic() - started)
    finally:
        cluster.stop(spark)
        if served is not None:
            served.stop()
    return PredictSummary(figures["batches"], figures["written"], output, figures["version"])
