"""`streamtrain run`: the online training job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline import config
from pipeline.cli.base import bootstrap_option, cli, kafka_conf_option, resolve_kafka_conf
from pipeline.errors import ConfigError
from pipeline.jobs import run_record
from producers import datasets


@cli.command()
@click.option(
    "--dataset",
    type=click.Choice(list(datasets.BUILTIN)),
    default="mnist",
    show_default=True,
    help="A built-in dataset, read from the data folder.",
)
@click.option(
    "--algorithm",
    default="sync",
    show_default=True,
    help="sync, single, averaging, downpour, agn, adag, aeasgd, eamsgd or dynsgd.",
)
@click.option("--workers", type=int, default=2, show_default=True, help="Parallel model replicas.")
@click.option(
    "--batch-size",
    type=int,
    help="Records per mini-batch on each worker; for sync, per round, split among the workers "
    "(default: 128; 16 for a table on the default model).",
)
@click.option(
    "--window",
    "communication_window",
    type=int,
    help="Mini-batches between exchanges with the parameter server (default: the algorithm's own; "
    "1 for sync, 5 for most asynchronous ones).",
)
@click.option(
    "--sync-overlap/--no-sync-overlap",
    default=False,
    show_default=True,
    help="sync only: push each gradient while the next computes, on a prediction of the center "
    "it will meet. Hides the exchange's time where the cores have room for it; every gradient "
    "lands one round late. docs/algorithms.md.",
)
@click.option(
    "--wire-dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default="float32",
    show_default=True,
    help="Deltas and weights on TCP (workers on other machines): bfloat16 or float16 send half "
    "the bytes; the server's center stays float32. docs/cluster.md.",
)
@click.option(
    "--ps-shards",
    type=int,
    default=1,
    show_default=True,
    help="Parameter-server processes, each serving a slice of the weights on its own port: more "
    "serve more workers' exchanges a second. docs/cluster.md.",
)
@click.option(
    "--epochs", type=int, default=1, show_default=True, help="Times the producer replays the data."
)
@click.option("--rate", type=float, help="Replay rate, records/s (default: full speed).")
@click.option("--until-accuracy", type=float, help="Stop once held-out accuracy reaches this.")
@click.option("--max-batches", type=int, help="Stop after this many micro-batches.")
@click.option(
    "--timeout", "timeout_s", type=float, help="Stop after this many seconds of streaming."
)
@bootstrap_option
@kafka_conf_option
@click.option(
    "--broker-engine",
    type=click.Choice(["kafka", "tansu", "noida"]),
    help="The embedded broker, when there is no --bootstrap (env STREAMTRAIN_BROKER_ENGINE; "
    "default kafka: Apache Kafka's own). docs/kafka.md.",
)
@click.option(
    "--topic", help="Train from this topic; with --bootstrap, fed by someone else (no replay)."
)
@click.option(
    "--master",
    default="local[*]",
    show_default=True,
    help="Spark master URL: local[N] or local[N,MAX_FAILURES], or spark://HOST:PORT (env "
    "STREAMTRAIN_MASTER; docs/cluster.md).",
)
@click.option(
    "--spark-conf",
    type=click.Path(dir_okay=False),
    help="A Spark properties file for the session (a cluster beyond loopback needs one with "
    "authentication and encryption: see streamtrain cluster-conf).",
)
@click.option(
    "--model", help="Your model: FILE.py:BUILD_FN or FILE.keras (default: the dataset's)."
)
@click.option(
    "--out", type=click.Path(file_okay=False), help="Output folder (default: runs/DATASET-TIME)."
)
@click.option(
    "--resume",
    "resume_dir",
    type=click.Path(file_okay=False),
    help="Continue the run in this folder after a stop or crash, with the options it recorded "
    f"({run_record.RECORD_FILE}). Given again, an option that defines the run must agree; these "
    f"may change between sessions: {run_record.may_change()}.",
)
@click.option(
    "--generation",
    type=int,
    metavar="BATCH",
    help="With --resume: go back to this kept checkpoint (a batch id; the error that offers it "
    "names it).",
)
@click.option(
    "--keep-checkpoints",
    type=int,
    default=3,
    show_default=True,
    help="Checkpoint generations kept beside state.npz (for --generation).",
)
@click.option(
    "--resume-if-exists",
    is_flag=True,
    help="With --out: continue the run there if it has a checkpoint, else start it (for services "
    "that a supervisor restarts).",
)
@click.option(
    "--serve-port",
    type=int,
    metavar="PORT",
    help="Serve predictions from the live weights here while training (TensorFlow Serving's REST "
    "API: POST /v1/models/DATASET:predict; 0: a free port). docs/serving.md.",
)
@click.option(
    "--serve-max-age",
    "serve_max_age_s",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds: never predict with weights older than this.",
)
@click.option(
    "--max-offsets-per-trigger",
    type=int,
    default=20_000,
    show_default=True,
    help="Records per micro-batch at most (with --freshness-target, the upper bound of its "
    "sizing).",
)
@click.option(
    "--freshness-target",
    "freshness_target_s",
    type=float,
    metavar="SECONDS",
    help="Size each micro-batch from the measured training rate so that the model stays this fresh "
    "(growing in a burst, shrinking after it), between --min- and --max-offsets-per-trigger. "
    "docs/operating.md: Freshness.",
)
@click.option(
    "--min-offsets-per-trigger",
    type=int,
    help="With --freshness-target: records per micro-batch at least, where that many wait (default "
    "1,000, or --max-offsets-per-trigger where lower).",
)
@click.option(
    "--source",
    type=click.Choice(["auto", "python", "jvm"]),
    default="auto",
    show_default=True,
    help="The Kafka source: Spark's own (jvm; its jars resolved once from Maven Central into "
    "the cache), streamtrain's (python), or auto: the faster of the two as measured, "
    "streamtrain's (env STREAMTRAIN_SOURCE). docs/kafka.md.",
)
@click.option(
    "--isolation-level",
    default="read_committed",
    show_default=True,
    help="Kafka's: read_committed trains no record of an aborted transaction; read_uncommitted "
    "trains every record written.",
)
@click.option(
    "--on-poison",
    type=click.Choice(["fail", "skip"]),
    default="fail",
    show_default=True,
    help="A record batch that cannot be read (corrupt, unknown codec): stop with one line (fail), "
    "or pass over it (skip): its offsets and cause go to the report, a metric and the dead-letter "
    "topic.",
)
@click.option(
    "--on-drift",
    type=click.Choice(["alert", "adapt"]),
    default="alert",
    show_default=True,
    help="When the stream drifts (the prequential loss rises, the class prior or a table's "
    "columns move): say so (a status line, a metric, the report), or also adapt (train the "
    "drift's micro-batch again, then raise the learning rate and train each record more than "
    "once for a while). Either way the held-out score moves to records after the drift. "
    "docs/drift.md.",
)
@click.option(
    "--drift",
    metavar="KEY=VALUE,...",
    help="The drift signals' settings (warmup, cooldown, loss_delta, loss_min_rise, loss_z, "
    "prior_threshold, prior_window, feature_threshold, feature_window, adapt_lr_scale, "
    "adapt_records, adapt_passes, adapt_replay). "
    "docs/drift.md.",
)
@click.option(
    "--max-rejected",
    type=float,
    metavar="SHARE",
    help="Stop (one line, the reasons and first rows) once more than this share of the records "
    "read is rejected: rows the schema cannot encode, records that do not decode. Default 0.1.",
)
@click.option(
    "--divergence-check/--no-divergence-check",
    default=True,
    show_default=True,
    help="Stop (one line naming the checkpoint to go back to) when the held-out score collapses "
    "to what predicting the majority class scores, after the model had learned. "
    "docs/operating.md: Faults.",
)
@click.option(
    "--eval-every",
    type=int,
    default=5,
    show_default=True,
    help="Score the held-out split every this many micro-batches (and at the end); with "
    "--freshness-target, scoring takes at most a tenth of the time.",
)
@click.option(
    "--metrics-port",
    type=int,
    default=0,
    show_default=True,
    help="Port of /metrics (0: a free port).",
)
@click.option(
    "--producer-metrics-port",
    type=int,
    default=0,
    show_default=True,
    help="Port of the replay producer's /metrics (0: a free port).",
)
@click.option("--data-dir", type=click.Path(file_okay=False), help="Folder holding the datasets.")
@click.option(
    "--seed",
    type=int,
    help="Seed for a repeatable run: the data's order and the model's initial weights.",
)
@click.option(
    "--data",
    type=click.Path(dir_okay=False),
    help="Your own table instead of --dataset: a CSV (with a header), JSON lines or Parquet file, "
    "replayed like a built-in dataset. docs/own-data.md.",
)
@click.option(
    "--label",
    help="The target column, to infer a schema (class names, or numbers: a numeric target).",
)
@click.option(
    "--schema",
    type=click.Path(dir_okay=False),
    help="The table's schema file (streamtrain schema infer writes one; it travels with the "
    "model).",
)
@click.option(
    "--format",
    "format",
    type=click.Choice(["binary", "json", "csv", "avro"]),
    help="The records' format on the topic: binary (the built-in datasets'), json (a table's "
    "default), csv lines or avro.",
)
@click.option(
    "--holdout",
    type=float,
    help="Share held out to score the model, never trained: a file's rows (default 0.1) or a "
    "topic's record keys (default 0.02).",
)
@click.option(
    "--eval-data",
    type=click.Path(dir_okay=False),
    help="Score on this file's rows instead of a held-out share (same columns as the topic).",
)
@click.option(
    "--schema-registry",
    metavar="URL",
    help="Avro in the Confluent wire format: the Schema Registry that resolves its schema ids.",
)
def run(
    resume_dir: str | None,
    out: str | None,
    bootstrap: str | None,
    resume_if_exists: bool,
    **options: Any,
) -> None:
    """The main job: replay a dataset into Kafka and train a model online from the stream."""
    from pipeline.ingest.kafka import conf as kafka_conf
    from pipeline.jobs import online
    from pipeline.train import checkpoint

    if resume_dir and out and Path(out).resolve() != Path(resume_dir).resolve():
        raise ConfigError(
            "Pass either --out or --resume (the folder to continue), not two folders."
        )
    if resume_if_exists:
        if not out:
            raise ConfigError("--resume-if-exists needs --out, the folder to continue or start.")
        if (Path(out) / checkpoint.FILENAME).exists():
            resume_dir = out
    settings = config.settings()  # the environment's values, under the command line's
    context = click.get_current_context()
    given = {
        name
        for name in (*options, "bootstrap")
        if context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT
    }
    if "master" not in given:
        options["master"] = settings.master
    if "source" not in given:  # a default only: a resumed run reads with its recorded source
        options["source"] = settings.source
    # What the environment sets counts as given (a resumed run checks it like an option).
    given |= {
        name
        for name in ("master", "spark_conf", "bootstrap", "kafka_conf")
        if name in settings.model_fields_set
    }
    options["spark_conf"] = options["spark_conf"] or (
        str(settings.spark_conf) if settings.spark_conf else None
    )
    options["kafka_conf"] = resolve_kafka_conf(options["kafka_conf"])
    options["bootstrap"] = (
        bootstrap or settings.bootstrap or kafka_conf.load(options["kafka_conf"]).bootstrap
    )
    if resume_dir:  # the recorded run, checked against what was given again, before anything starts
        options = run_record.resume_options(Path(resume_dir).resolve(), options, given)
    cfg = online.RunConfig(out=resume_dir or out, resume=bool(resume_dir), **options)
    report = online.run(cfg)
    if report.time_shares:
        click.echo(report.time_line())
    click.echo(report.summary())
    click.echo(f"model and report in {report.out}")
