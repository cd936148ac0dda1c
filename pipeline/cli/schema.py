"""`streamtrain schema`: a table's schema, read off a file or a topic, for the user to edit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline.cli.base import cli, kafka_conf_option
from pipeline.errors import ConfigError


@cli.group()
def schema() -> None:
    """A table's schema: its features, their kinds, the label and the records' format."""


@schema.command("infer")
@click.argument("source", required=False, type=click.Path(dir_okay=False))
@click.option("--label", help="The target column (omit for unlabelled instances).")
@click.option(
    "--target",
    type=click.Choice(["auto", "classes", "numeric"]),
    default="auto",
    show_default=True,
    help="The label as classes or as a numeric target (regression); auto: numbers with many "
    "values are a target.",
)
@click.option(
    "--ignore",
    multiple=True,
    metavar="COLUMN",
    help="A column that is not a feature (an id); repeatable.",
)
@click.option(
    "--numeric",
    multiple=True,
    metavar="COLUMN",
    help="Read this column as numbers even where it holds words (those are then rejected, counted "
    "by name); repeatable. schema infer names the columns it took as categorical for their words.",
)
@click.option(
    "--format",
    "format",
    type=click.Choice(["json", "csv", "avro"]),
    help="The records' format on the topic (default: json; avro for an Avro file or --topic of "
    "Avro).",
)
@click.option(
    "--topic",
    help="Read the first records of this topic (JSON objects, or Avro with --format avro) "
    "instead of a file.",
)
@click.option("--bootstrap", metavar="HOST:PORT", help="The Kafka of --topic.")
@kafka_conf_option
@click.option(
    "--schema-registry",
    metavar="URL",
    help="Avro in the Confluent wire format: the registry that resolves its schema ids.",
)
@click.option(
    "--avro-schema",
    type=click.Path(dir_okay=False),
    metavar="FILE.avsc",
    help="Avro records: the writer's schema (plain bodies, or Confluent-framed without a "
    "registry).",
)
@click.option(
    "--rows", type=int, default=10_000, show_default=True, help="Rows (or records) to read."
)
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False),
    help="Write the schema here (default: print it).",
)
def infer(
    source: str | None,
    label: str | None,
    target: str,
    ignore: tuple[str, ...],
    numeric: tuple[str, ...],
    format: str | None,
    topic: str | None,
    bootstrap: str | None,
    kafka_conf: str | None,
    schema_registry: str | None,
    avro_schema: str | None,
    rows: int,
    out: str | None,
) -> None:
    """Write a schema for SOURCE (a CSV, JSON lines, Parquet or Avro file), or for --topic."""
    import dataclasses

    from pipeline import table
    from pipeline.table.inference import mixed_columns

    if bool(source) == bool(topic):
        raise ConfigError("Expected a file (SOURCE) or --topic T with --bootstrap B, one of them.")
    if schema_registry:
        from pipeline.table.registry import check_reachable

        check_reachable(schema_registry)
    writer = _writer_schema(avro_schema)
    extra: dict[str, Any] = {}
    if topic:
        fmt = format or "json"
        columns, extra = _topic_columns(
            topic, bootstrap, kafka_conf, rows, fmt, writer, schema_registry
        )
    else:
        from producers.datasets.table import sample_columns
        from producers.datasets.table_files import avro_file_schema, file_kind

        path = Path(source or "")
        avro_file = path.is_file() and file_kind(path) == "avro"
        fmt = format or ("avro" if avro_file else "json")
        columns = sample_columns(path, rows)
        if fmt == "avro":
            extra = {"avro": writer or (avro_file_schema(path) if avro_file else None)}
    regression = {"auto": None, "classes": False, "numeric": True}[target]
    inferred = table.infer(
        columns, label=label, regression=regression, ignore=ignore, format=fmt, numeric=numeric
    )
    if (
        fmt == "avro"
    ):  # the writer's own schema (the file's, the topic's) and how its records are framed
        avro = extra.get("avro") or (None if schema_registry else inferred.avro)
        inferred = dataclasses.replace(
            inferred,
            avro=avro,
            registry=schema_registry,
            wire=extra.get("wire") or "plain",
            schema_id=extra.get("schema_id"),
        )
    for mixed in mixed_columns(
        columns, inferred
    ):  # a column of numbers with words among them: say so
        click.echo(f"note: {mixed.line()}", err=True)
    text = inferred.to_json() + "\n"
    if out:
        Path(out).write_text(text)
        kinds = {
            k: sum(f.kind == k for f in inferred.features)
            for k in ("numeric", "categorical", "boolean")
        }
        what = (
            ("a numeric target" if inferred.regression else f"{inferred.num_classes} classes")
            if label
            else "no label"
        )
        click.echo(
            f"{out}: {len(inferred.features)} features "
            f"({', '.join(f'{n} {k}' for k, n in kinds.items() if n)}; {inferred.width} encoded "
            f"columns), {what}; read it, edit it, pass it as --schema",
            err=True,
        )
    else:
        click.echo(text, nl=False)


def _writer_schema(path: str | None) -> dict[str, object] | None:
    """The writer's Avro schema from an ``.avsc`` file, or None."""
    if path is None:
        return None
    import json

    try:
        found = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"Expected the writer's Avro schema (JSON) in --avro-schema {path}. Received: {e}."
        ) from None
    if not isinstance(found, dict) or found.get("type") != "record":
        raise ConfigError(f'Expected an Avro record schema ({{"type": "record", ...}}) in {path}.')
    return found


def _topic_columns(
    topic: str,
    bootstrap: str | None,
    kafka_conf: str | None,
    rows: int,
    fmt: str,
    writer: dict[str, object] | None,
    registry_url: str | None,
) -> tuple[dict[str, list[Any]], dict[str, Any]]:
    """The first records of a topic by column, and what the schema must say of their Avro
    wire (the writer's schema, the framing and its id, the registry)."""
    from pipeline.cli.base import resolve_bootstrap, resolve_kafka_conf
    from pipeline.jobs.user_data import sample_topic
    from pipeline.table.records import json_columns

    kafka_conf = resolve_kafka_conf(kafka_conf)
    sample = sample_topic(
        resolve_bootstrap(bootstrap, kafka_conf), topic, rows, kafka_conf=kafka_conf
    )
    values = [value for _, value, _ in sample]
    if fmt == "avro":
        from pipeline.table import avro_sample
        from pipeline.table.registry import Registry

        registry = Registry.for_url(registry_url) if registry_url else None
        got = avro_sample.read(values, writer=writer, registry=registry)
        wire: dict[str, Any] = {
            "avro": got.writer,
            "registry": registry_url,
            "wire": "confluent" if got.framed and not registry_url else None,
            "schema_id": got.schema_id if got.framed and not registry_url else None,
        }
        return dict(got.columns), wire
    if fmt != "json":
        raise ConfigError(
            "Expected --format json or avro for --topic (a schema is read off JSON objects or "
            f"Avro records). Received: {fmt}; write one from a file of the same rows instead."
        )
    columns = json_columns(values)
    if not columns:
        raise ConfigError(
            f"Expected JSON objects in topic {topic!r} to read a schema from. Received none"
            + (
                " (the records look like Avro: pass --format avro)"
                if values and (values[0] or b"")[:1] in (b"\x00", b"\x02")
                else ""
            )
            + "."
        )
    return columns, {}
