"""`streamtrain schema`: a table's schema, read off a file or a topic, for the user to edit."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.base import cli, kafka_conf_option
from pipeline.errors import ConfigError


@cli.group()
def schema() -> None:
    """A table's schema: its features, their kinds, the label and the records' format."""


@schema.command("infer")
@click.argument("source", required=False, type=click.Path(dir_okay=False))
@click.option("--label", help="The target column (omit for unlabelled instances).")
@click.option("--target", type=click.Choice(["auto", "classes", "numeric"]), default="auto", show_default=True,
              help="The label as classes or as a numeric target (regression); auto: numbers with many values are a "
                   "target.")
@click.option("--ignore", multiple=True, metavar="COLUMN", help="A column that is not a feature (an id); repeatable.")
@click.option("--format", "format", type=click.Choice(["json", "csv", "avro"]), default="json", show_default=True,
              help="The records' format on the topic.")
@click.option("--topic", help="Read the first records of this topic (JSON objects) instead of a file.")
@click.option("--bootstrap", metavar="HOST:PORT", help="The Kafka of --topic.")
@kafka_conf_option
@click.option("--rows", type=int, default=10_000, show_default=True, help="Rows (or records) to read.")
@click.option("-o", "--out", type=click.Path(dir_okay=False), help="Write the schema here (default: print it).")
def infer(source: str | None, label: str | None, target: str, ignore: tuple[str, ...], format: str,
          topic: str | None, bootstrap: str | None, kafka_conf: str | None, rows: int, out: str | None) -> None:
    """Write a schema for SOURCE (a CSV, JSON lines or Parquet file), or for --topic."""
    from pipeline import table

    if bool(source) == bool(topic):
        raise ConfigError("Expected a file (SOURCE) or --topic T with --bootstrap B, one of them.")
    if topic:
        columns = _topic_columns(topic, bootstrap, kafka_conf, rows)
    else:
        from producers.datasets.table import sample_columns

        columns = sample_columns(Path(source or ""), rows)
    regression = {"auto": None, "classes": False, "numeric": True}[target]
    inferred = table.infer(columns, label=label, regression=regression, ignore=ignore, format=format)
    text = inferred.to_json() + "\n"
    if out:
        Path(out).write_text(text)
        kinds = {k: sum(f.kind == k for f in inferred.features) for k in ("numeric", "categorical", "boolean")}
        what = ("a numeric target" if inferred.regression else f"{inferred.num_classes} classes") if label else "no label"
        click.echo(f"{out}: {len(inferred.features)} features ({', '.join(f'{n} {k}' for k, n in kinds.items() if n)}; "
                   f"{inferred.width} encoded columns), {what}; read it, edit it, pass it as --schema", err=True)
    else:
        click.echo(text, nl=False)


def _topic_columns(topic: str, bootstrap: str | None, kafka_conf: str | None, rows: int) -> dict[str, list[object]]:
    from pipeline.cli.base import resolve_bootstrap, resolve_kafka_conf
    from pipeline.jobs.user_data import sample_topic
    from pipeline.table.records import json_columns

    kafka_conf = resolve_kafka_conf(kafka_conf)
    sample = sample_topic(resolve_bootstrap(bootstrap, kafka_conf), topic, rows, kafka_conf=kafka_conf)
    columns = json_columns([value for _, value, _ in sample])
    if not columns:
        raise ConfigError(f"Expected JSON objects in topic {topic!r} to read a schema from. Received none.")
    return columns
