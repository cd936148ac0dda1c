"""The checks of one online run's settings (:class:`~pipeline.jobs.run_config.RunConfig`),
made before anything starts: each bad option is one line naming what was expected, what
was received and what to do, before the broker, the replay or Spark start.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import ConfigError

if TYPE_CHECKING:
    from pipeline.jobs.run_config import RunConfig


def _builtin_datasets() -> tuple[str, ...]:
    from producers import datasets

    return datasets.BUILTIN


def check(cfg: RunConfig) -> None:
    """Raise :class:`~pipeline.errors.ConfigError` for the first bad setting of ``cfg``."""
    names = _builtin_datasets()
    if cfg.dataset not in names:
        raise ConfigError(f"Expected --dataset in {names}. Received: {cfg.dataset!r}")
    _check_table(cfg)
    for name in (
        "workers",
        "batch_size",
        "communication_window",
        "epochs",
        "max_offsets_per_trigger",
        "eval_every",
        "ps_shards",
    ):
        value = getattr(cfg, name)
        if value is not None and value < 1:
            raise ConfigError(f"Expected --{name.replace('_', '-')} >= 1. Received: {value}")
    if cfg.freshness_target_s is not None:
        cfg.sizing  # noqa: B018 - a target and bounds that cannot work: one line now, before anything starts
    if cfg.sync_overlap and cfg.algorithm != "sync":
        raise ConfigError(
            "--sync-overlap is synchronous SGD's alone (--algorithm sync). Received: "
            f"--algorithm {cfg.algorithm}. Drop --sync-overlap."
        )
    if cfg.on_drift not in ("alert", "adapt"):
        raise ConfigError(
            f"Expected --on-drift alert or adapt. Received: {cfg.on_drift!r}. See docs/drift.md."
        )
    from pipeline.train.drift import DriftSettings

    DriftSettings.parse(cfg.drift)
    if cfg.wire_dtype not in ("float32", "bfloat16", "float16"):
        raise ConfigError(
            f"Expected --wire-dtype float32, bfloat16 or float16. Received: {cfg.wire_dtype!r}"
        )
    if cfg.max_rejected is not None and not 0 <= cfg.max_rejected <= 1:
        raise ConfigError(
            f"Expected --max-rejected in [0, 1] (a share of the records read). "
            f"Received: {cfg.max_rejected}"
        )
    if cfg.on_poison not in ("fail", "skip"):
        raise ConfigError(f"Expected --on-poison fail or skip. Received: {cfg.on_poison!r}")
    if cfg.isolation_level not in ("read_committed", "read_uncommitted"):
        raise ConfigError(
            "Expected --isolation-level read_committed or read_uncommitted. "
            f"Received: {cfg.isolation_level!r}"
        )
    _check_source(cfg)
    if cfg.until_accuracy is not None and not 0 < cfg.until_accuracy <= 1:
        raise ConfigError(f"Expected --until-accuracy in (0, 1]. Received: {cfg.until_accuracy}")
    if cfg.serve_port is not None:
        from pipeline import config
        from pipeline.serve.process import check_serving, host_and_token

        host, _ = host_and_token(config.settings())
        check_serving(cfg.serve_port, cfg.serve_max_age_s, host=host)
    if cfg.kafka_conf:
        if not cfg.bootstrap:
            raise ConfigError(
                "Expected --bootstrap HOST:PORT (or bootstrap.servers in the file) with "
                f"--kafka-conf {cfg.kafka_conf}: the embedded broker is PLAINTEXT on "
                "loopback and needs none."
            )
        from pipeline.ingest.kafka import conf

        conf.load(cfg.kafka_conf)  # a bad file is one line now, not a failed task later
    if cfg.master.startswith("spark://"):
        _check_cluster(cfg)
    from pipeline.cluster import jvmcache

    jvmcache.check_java()  # before the broker and the replay start, not once Spark fails
    if cfg.resume and not cfg.out:
        raise ConfigError("--resume needs the run's output folder.")
    if cfg.generation is not None and not cfg.resume:
        raise ConfigError(
            f"--generation {cfg.generation} needs --resume DIR, the run to go back in."
        )
    if cfg.keep_checkpoints < 1:
        raise ConfigError(f"Expected --keep-checkpoints >= 1. Received: {cfg.keep_checkpoints}")
    if cfg.model is not None:
        from pipeline.train.probe import check_source

        check_source(cfg.model)


def _check_source(cfg: RunConfig) -> None:
    """The Kafka source (:mod:`pipeline.ingest.sources`), against what it cannot do."""
    from pipeline import config
    from pipeline.ingest import sources

    if cfg.source not in sources.SOURCES:
        raise ConfigError(f"Expected --source in {sources.SOURCES}. Received: {cfg.source!r}")
    if cfg.source != "jvm":
        return
    if cfg.freshness_target_s is not None:
        raise ConfigError(
            "--freshness-target sizes batches in streamtrain's Python source; Spark's own "
            "(--source jvm) plans a fixed maxOffsetsPerTrigger. Use --source python (or auto), "
            "or drop the target."
        )
    if not cfg.bootstrap and (cfg.broker_engine or config.settings().broker_engine) == "tansu":
        raise ConfigError(
            "--source jvm reads short of the end on the embedded Tansu broker (its ListOffsets "
            "answers the last batch's first offset + 1). Use --broker-engine kafka (or noida), "
            "or --source python. See docs/kafka.md."
        )
    from pipeline.cluster import kafka_jars

    kafka_jars.jars()  # resolved into the cache now, or one line before anything starts


def source_of(cfg: RunConfig) -> str:
    """``cfg.source`` with ``auto`` resolved: streamtrain's Python source, the faster of the
    two on the same topic (``bench/source.py``, ``jvm_vs_python`` 0.34; docs/kafka.md)."""
    return "python" if cfg.source == "auto" else cfg.source


def _check_table(cfg: RunConfig) -> None:
    """A user's data: a file, or a topic someone else feeds, and how to read it."""
    if cfg.format not in (None, "binary", "json", "csv", "avro"):
        raise ConfigError(f"Expected --format binary, json, csv or avro. Received: {cfg.format!r}")
    if cfg.holdout is not None and not 0 <= cfg.holdout < 1:
        raise ConfigError(f"Expected --holdout in [0, 1). Received: {cfg.holdout}")
    if not cfg.table:
        return
    if cfg.data and cfg.topic and cfg.bootstrap:
        raise ConfigError(
            "Pass --data (a file to replay) or --topic with --bootstrap (a topic fed by "
            "someone else), not both."
        )
    if not cfg.data and not (cfg.topic and cfg.bootstrap):
        raise ConfigError(
            "Expected --data FILE, or --topic T with --bootstrap B, for "
            "--label/--schema/--format (a built-in dataset takes none of them)."
        )
    # A run resumed from before this check was made may have recorded them (ignored then too).
    if not cfg.data and not cfg.resume and (cfg.epochs != 1 or cfg.rate is not None):
        given = f"--epochs {cfg.epochs}" if cfg.epochs != 1 else f"--rate {cfg.rate:g}"
        raise ConfigError(
            "--epochs and --rate set how the run replays a file; a topic someone else feeds "
            f"is read as it comes. Received: {given} with --topic {cfg.topic}. Drop it."
        )
    if not cfg.schema and not cfg.label:
        raise ConfigError(
            "Expected --label COLUMN (the target, to infer a schema) or --schema FILE."
        )
    for path, option in (
        (cfg.data, "--data"),
        (cfg.schema, "--schema"),
        (cfg.eval_data, "--eval-data"),
    ):
        if path and not Path(path).is_file():
            raise ConfigError(
                f"Expected a file for {option}. Received: {path}, which does not exist."
            )
    if cfg.schema_registry:
        from pipeline.table.registry import check_reachable

        check_reachable(cfg.schema_registry)  # one line in seconds, before Kafka and Spark start


def _check_cluster(cfg: RunConfig) -> None:
    """A standalone cluster: its security settings, and a Kafka its executors can reach."""
    from pipeline import config
    from pipeline.cluster import reach, security

    security.spark_conf(cfg.master, cfg.spark_conf)
    reach.check_master(
        cfg.master, wait_s=config.settings().master_wait_s
    )  # before the broker and the replay
    if not cfg.bootstrap and not security.on_loopback(cfg.master):
        raise ConfigError(
            f"Expected --bootstrap HOST:PORT for the cluster at {cfg.master}: its executors "
            "read Kafka, and the embedded broker listens on this machine's loopback only."
        )
