"""Rows of named fields to Kafka values in a table's format (what a replay of a file
sends, and what the benchmarks and tests write): JSON objects, CSV lines or Avro.

Example:
    >>> from pipeline.table.schema import Feature, Label, TableSchema
    >>> s = TableSchema(
    ...     (Feature("a"), Feature("c", "categorical", vocabulary=("x",))), Label("y", ("n", "p"))
    ... )
    >>> encode_values([{"a": 1.5, "c": None, "y": "p"}], s)
    [b'{"a":1.5,"c":null,"y":"p"}']
    >>> encode_values([{"a": 1.5, "c": "x", "y": "p"}], s.with_format("csv"))
    [b'1.5,x,p']
    >>> avro = s.with_format("avro")
    >>> from pipeline.table import records
    >>> records.decode(encode_values([{"a": 2.0, "c": "x", "y": "n"}], avro), avro).x.tolist()
    [[2.0, 0.0, 1.0]]
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from typing import Any

from pipeline.table.schema import TableSchema


def _plain(v: Any) -> Any:
    """A value JSON and Avro can carry: NaN is a gap, numpy scalars become Python ones."""
    if v is None:
        return None
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def encode_values(
    rows: Sequence[dict[str, Any]], schema: TableSchema, *, schema_id: int | None = None
) -> list[bytes]:
    """Encode rows in ``schema.format``; Avro with ``schema_id`` gets the Confluent framing."""
    if schema.format == "json":
        import orjson

        return [orjson.dumps({k: _plain(v) for k, v in row.items()}) for row in rows]
    if schema.format == "csv":
        out = []
        for row in rows:
            buf = io.StringIO()
            csv.writer(buf, lineterminator="").writerow(
                ["" if (v := _plain(row.get(c))) is None else v for c in schema.csv_columns]
            )
            out.append(buf.getvalue().encode())
        return out
    return _avro_values(rows, schema, schema_id)


def _avro_values(
    rows: Sequence[dict[str, Any]], schema: TableSchema, schema_id: int | None
) -> list[bytes]:
    from fastavro import parse_schema, schemaless_writer

    writer: Any = parse_schema(schema.avro or writer_schema(schema))
    names = [f["name"] for f in writer["fields"]]
    kinds = {f["name"]: [t for t in f["type"] if t != "null"] for f in writer["fields"]}
    prefix = b"" if schema_id is None else b"\x00" + schema_id.to_bytes(4, "big")
    out = []
    for row in rows:
        buf = io.BytesIO()
        buf.write(prefix)
        record = {n: _typed(_plain(row.get(n)), kinds[n]) for n in names}
        schemaless_writer(buf, writer, record)
        out.append(buf.getvalue())
    return out


def _typed(v: Any, kinds: list[Any]) -> Any:
    """A file's value as the Avro field's type wants it (a CSV's number in a string field)."""
    if v is None or not kinds:
        return v
    if kinds[0] == "string" and not isinstance(v, str):
        return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
    if kinds[0] == "double" and isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return v


def writer_schema(schema: TableSchema, *, name: str = "Record") -> dict[str, Any]:
    """An Avro record schema for the table's rows: every field nullable, gaps as null (an
    ID a long or a string).

    >>> from pipeline.table.schema import Feature, TableSchema
    >>> writer_schema(TableSchema((Feature("a"),), None))["fields"]
    [{'name': 'a', 'type': ['null', 'double'], 'default': None}]
    """
    kinds: dict[str, list[str]] = {
        "numeric": ["double"],
        "categorical": ["string"],
        "boolean": ["boolean"],
        "id": ["long", "string"],
    }
    fields = [
        {"name": f.name, "type": ["null", *kinds[f.kind]], "default": None} for f in schema.features
    ]
    if schema.label is not None:
        kind = "double" if schema.label.regression else "string"
        fields.append({"name": schema.label.name, "type": ["null", kind], "default": None})
    return {"type": "record", "name": name, "fields": fields}
