"""`streamtrain broker` (the embedded Kafka broker) and `streamtrain produce` (the replay)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from pipeline import config
from pipeline.cli.base import (
    bootstrap_option,
    cli,
    kafka_conf_option,
    resolve_bootstrap,
    resolve_kafka_conf,
)
from pipeline.errors import ConfigError, StreamtrainError
from producers import datasets

log = logging.getLogger(__name__)


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=9092, show_default=True, help="Port to listen on (0: a free port).")
@click.option(
    "--engine",
    type=click.Choice(["kafka", "tansu", "noida"]),
    help="kafka (default; env STREAMTRAIN_BROKER_ENGINE): Apache Kafka's own broker (KRaft; "
    "needs Java, its jars resolved from Maven once). tansu: memory only, up in milliseconds, "
    "nothing to download. noida: keeps its data in --storage across restarts.",
)
@click.option(
    "--storage",
    metavar="URL|FOLDER",
    help="tansu: its storage engine URL (default memory://tansu/). kafka, noida: the folder that "
    "keeps the data across restarts (default: a temporary folder, removed at exit); stopped with "
    "Ctrl-C or SIGTERM it saves every record it acknowledged, and a restart on the same --port "
    "and --storage carries on where it stopped (a SIGKILL can lose the last ~0.1 s).",
)
@click.option(
    "--log", "log_path", type=click.Path(dir_okay=False), help="Write the broker's own log here."
)
def broker(
    host: str, port: int, engine: str | None, storage: str | None, log_path: str | None
) -> None:
    """Run the embedded Kafka broker until Ctrl-C.

    Three engines: Apache Kafka's own broker, and two re-implementations that start in
    milliseconds; what each serves is in docs/kafka.md (The embedded brokers).
    """
    from pipeline.ingest.kafka import broker as broker_mod

    b = broker_mod.EmbeddedBroker(
        host=host, port=port, engine=engine, storage=storage, log_path=log_path
    ).start()
    state = broker_mod.write_state(b)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    click.echo(
        f"embedded Kafka broker ({b.engine}, pid {b.pid}) ready at {b.bootstrap}; Ctrl-C stops it",
        err=True,
    )
    click.echo(b.bootstrap)
    try:
        while not stop.wait(0.5):
            if not b.alive:
                raise StreamtrainError(
                    f"The embedded broker exited unexpectedly (see --log {log_path or 'FILE'})."
                )
    except KeyboardInterrupt:
        pass
    finally:
        b.stop()
        broker_mod.clear_state()
        log.info("broker stopped; %s removed", state)


def _dataset(name: str, path: str | None, data_dir: str | None, **options: Any) -> Any:
    kwargs = {k: v for k, v in options.items() if v is not None}
    if name in datasets.BUILTIN:
        kwargs["data_dir"] = Path(data_dir) if data_dir else config.data_dir()
    return datasets.get(name, path, **kwargs)


@cli.command()
@click.argument("dataset", type=click.Choice(list(datasets.NAMES)))
@click.argument("path", required=False, type=click.Path())
@click.option("--topic", help="Kafka topic (default: the dataset's name).")
@click.option("--rate", type=float, help="Records per second (default: full speed).")
@click.option(
    "--loop", is_flag=True, help="Start over at the end of the data, until --limit or Ctrl-C."
)
@click.option("--limit", type=int, help="Stop after this many records.")
@click.option(
    "--epochs", type=int, help="Stop after this many passes over the data (implies --loop)."
)
@click.option("--split", type=click.Choice(["train", "test"]), default="train", show_default=True)
@click.option(
    "--partitions", type=int, default=2, show_default=True, help="Partitions of a new topic."
)
@bootstrap_option
@kafka_conf_option
@click.option("--metrics-port", type=int, help="Port of this producer's /metrics (0: a free port).")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Folder holding the datasets.")
@click.option(
    "--label",
    "--label-column",
    "label",
    help="csv/jsonl/parquet: the target column (to infer a schema).",
)
@click.option(
    "--schema",
    type=click.Path(dir_okay=False),
    help="csv/jsonl/parquet: the table's schema file (streamtrain schema infer writes one).",
)
@click.option(
    "--format",
    "format",
    type=click.Choice(["json", "csv", "avro"]),
    help="csv/jsonl/parquet: the records' format on the topic (default: the schema's, json).",
)
@click.option(
    "--holdout",
    type=float,
    help="csv/jsonl/parquet: hold out this share of rows (--split test sends them).",
)
@click.option("--test-path", type=click.Path(), help="higgs: a separate test file.")
@click.option("--num-classes", type=int, help="npz: labels outside [0, N) count as malformed.")
@click.option(
    "--max-malformed",
    type=float,
    metavar="N|FRACTION",
    help="Fail once more rows than this are malformed: a count, or a fraction below 1 (0.05: 5%; "
    "default 0.5 for a table: most rows rejected means the wrong file or schema).",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Continue a replay that was stopped or killed: skip the records of this replay's order "
    "that the topic holds already (a topic only this replay writes to), so none is sent twice.",
)
@click.option(
    "--compression",
    type=click.Choice(["none", "gzip", "snappy", "lz4", "zstd"]),
    default="none",
    show_default=True,
    help="Kafka's codec for the record batches sent (every one is read back).",
)
@click.option(
    "--progress/--no-progress", default=None, help="Progress bar (default: on a terminal)."
)
def produce(dataset: str, path: str | None, **options: Any) -> None:
    """Replay DATASET (from PATH, or the data folder) into a Kafka topic."""
    from pipeline.cluster.processes import stop_on_signals
    from producers import replay

    received: list[int] = []
    with stop_on_signals(
        threading.Event(), received=received
    ) as stop:  # Ctrl-C from here on: flush and report
        report = _produce(replay, stop, dataset, path, **options)
    click.echo(report.summary())
    # A SIGTERM (docker compose stop, a supervisor) is a requested stop, done cleanly: 0, as
    # a restart policy expects of it. A Ctrl-C keeps the shell's 130.
    if report.interrupted and received[:1] != [signal.SIGTERM]:
        sys.exit(130)
    if report.send_errors:
        sys.exit(1)


def _produce(
    replay: Any,
    stop: threading.Event,
    dataset: str,
    path: str | None,
    *,
    topic: str | None,
    rate: float | None,
    loop: bool,
    limit: int | None,
    epochs: int | None,
    split: str,
    partitions: int,
    bootstrap: str | None,
    kafka_conf: str | None,
    metrics_port: int | None,
    data_dir: str | None,
    label: str | None,
    schema: str | None,
    format: str | None,
    holdout: float | None,
    test_path: str | None,
    num_classes: int | None,
    max_malformed: float | None,
    progress: bool | None,
    resume: bool,
    compression: str,
) -> Any:
    given = {
        "label": label,
        "schema": schema,
        "format": format,
        "holdout": holdout,
        "test_path": test_path,
        "num_classes": num_classes,
    }
    takes = datasets.options(dataset)
    misplaced = [k for k, v in given.items() if v is not None and k not in takes]
    if misplaced:
        flags = ", ".join("--" + k.replace("_", "-") for k in misplaced)
        raise ConfigError(
            f"{flags} does not apply to {dataset}; it takes only: "
            f"{', '.join('--' + k.replace('_', '-') for k in takes) or 'PATH'}."
        )
    if "label" in takes:  # a table: every row is sent unless --holdout says otherwise
        given["holdout"] = holdout or 0.0
        if max_malformed is None:
            from pipeline.jobs.replay_process import MOST_ROWS

            max_malformed = MOST_ROWS
    kafka_conf = resolve_kafka_conf(kafka_conf)
    data = _dataset(dataset, path, data_dir, **{k: v for k, v in given.items() if k in takes})
    target = resolve_bootstrap(bootstrap, kafka_conf)
    settings = config.settings()
    return replay.replay_with_metrics(
        data,
        metrics_host=settings.metrics_host,
        metrics_port=settings.producer_metrics_port if metrics_port is None else metrics_port,
        bootstrap=target,
        topic=topic or dataset,
        rate=rate,
        loop=loop,
        limit=limit,
        epochs=epochs,
        split=split,
        partitions=partitions,
        progress=sys.stderr.isatty() if progress is None else progress,
        max_malformed=max_malformed,
        stop=stop,
        resume=resume,
        kafka_conf=kafka_conf,
        producer_config={"compression_type": None if compression == "none" else compression},
    )
