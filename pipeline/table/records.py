"""Kafka values of a table's topic (JSON objects, CSV lines, Avro) to columns, then to
the model's input: :func:`decode` is what :func:`pipeline.codec.decode` does for a table.

Each format parses a record into named fields; a record that does not parse is
rejected (``not_json``, ``not_an_object``, ``wrong_field_count:3``, ``not_avro``,
``unknown_schema_id:7``; ``confluent_framed``: Confluent-framed Avro read as plain bodies) and the
rest go through :class:`~pipeline.table.transform.Encoder`, whose rejects name the field.

Example:
    >>> from pipeline.table.schema import Feature, Label, TableSchema
    >>> s = TableSchema((Feature("a"), Feature("b", "boolean")), Label("y", ("n", "p")))
    >>> d = decode([b'{"a": 1.5, "b": true, "y": "p"}', b"[1]", b'{"a": 2, "y": "q"}', b"{"], s)
    >>> d.x.tolist(), d.y.tolist(), d.reason_names()
    ([[1.5, 1.0]], [1], ['not_an_object', 'unknown_class:y', 'not_json'])
    >>> c = s.with_format("csv")
    >>> decode([b"1.5,yes,p", b"2,no", b'"3",0,n'], c).x.tolist()
    [[1.5, 1.0], [3.0, 0.0]]
"""

from __future__ import annotations

import csv
import functools
import io
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pipeline import codec
from pipeline.table.schema import TableSchema
from pipeline.table.transform import Encoder, Reasons

#: Reasons a record is rejected before its fields are read.
PARSE_REASONS = ("not_json", "not_an_object", "not_csv", "not_avro")
#: Confluent's wire format: a zero byte, the schema id (4 bytes, big-endian), the Avro body.
CONFLUENT_MAGIC = 0


@functools.lru_cache(maxsize=8)
def _encoder(schema: TableSchema) -> Encoder:
    """The schema's encoder, its lookups built once per process: keyed by the schema's value,
    since each task on an executor unpickles its own copy (a cache by ``id`` grew a task at a
    time)."""
    return Encoder(schema)


def _as_list(values: Any) -> list[bytes | None]:
    return values.to_pylist() if hasattr(values, "to_pylist") else list(values)


def decode(values: Any, schema: TableSchema, *, registry: Any = None) -> codec.Decoded:
    """Decode a block of Kafka values (bytes or a pyarrow binary array) of a table's topic.

    Args:
        values: the records.
        schema: the table; its ``format`` says how the values are written.
        registry: for Avro in the Confluent wire format, what resolves a schema id
            (:class:`~pipeline.table.registry.Registry`; made from ``schema.registry`` if None).
    """
    raw = _as_list(values)
    reasons = Reasons()
    parse = {"json": _json_rows, "csv": _csv_rows, "avro": _avro_rows}[schema.format]
    columns, good, bad, why = parse(raw, schema, reasons, registry)
    x, y, code = _encoder(schema).encode(columns, len(good), reasons)
    ok = code < 0
    accepted = np.asarray(good, np.int64)[ok]
    rejected = np.concatenate([np.asarray(bad, np.int64), np.asarray(good, np.int64)[~ok]])
    codes = np.concatenate([np.asarray(why, np.int64), code[~ok]])
    order = np.argsort(rejected, kind="stable")
    return codec.Decoded(
        x=np.ascontiguousarray(x[ok]),
        y=y[ok],
        accepted=accepted,
        rejected=rejected[order],
        reasons=codes[order].astype(np.int32),
        names=tuple(reasons.names),
    )


Rows = tuple[dict[str, list[Any]], list[int], list[int], list[int]]


def _names(schema: TableSchema) -> list[str]:
    return [f.name for f in schema.features] + ([schema.label.name] if schema.label else [])


def _by_column(rows: list[Any], names: list[str]) -> dict[str, Any]:
    """Rows of picked fields (a tuple each; the value itself for one name) by column."""
    if not rows:
        return {n: [] for n in names}
    if len(names) == 1:
        return {names[0]: rows}
    return dict(zip(names, zip(*rows, strict=True), strict=True))


def _columns_of(dicts: list[dict[str, Any]], schema: TableSchema) -> dict[str, Any]:
    """The records' fields by column. One C call per record picks every field at once
    (``itemgetter``; a field-by-field ``dict.get`` cost 4x the JSON parse); a record
    missing a field takes the slow path, the field a gap."""
    names = _names(schema)
    pick = operator.itemgetter(*names)
    try:
        rows = list(map(pick, dicts))
    except KeyError:
        rows = [tuple(d.get(n) for n in names) for d in dicts]
    return _by_column(rows, names)


def _json_rows(raw: list[bytes | None], schema: TableSchema, reasons: Reasons, _: Any) -> Rows:
    from pipeline.table import arrow_json

    typed = arrow_json.columns(
        raw, schema
    )  # every record an object of the schema's types: Arrow's columns
    if typed is not None:
        return typed, list(range(len(raw))), [], []
    loads = _json_loads()
    names = _names(schema)
    try:
        # The common block, every record an object holding every field: parsed and picked in
        # one pass of C calls, each dict dropped as soon as its fields are out (a Python loop
        # and a second pass over the dicts cost as much as the parse itself). Anything else
        # (a record that is not JSON, not an object, a field missing) takes the careful path.
        rows = list(map(operator.itemgetter(*names), map(loads, raw)))
        return _by_column(rows, names), list(range(len(raw))), [], []
    except (ValueError, TypeError, KeyError):
        pass
    dicts, good, bad, why = [], [], [], []
    not_json, not_object = reasons.code("not_json"), reasons.code("not_an_object")
    for i, v in enumerate(raw):
        try:
            d = loads(v or b"")
        except ValueError:
            bad.append(i)
            why.append(not_json)
            continue
        if d.__class__ is not dict:
            bad.append(i)
            why.append(not_object)
            continue
        dicts.append(d)
        good.append(i)
    return _columns_of(dicts, schema), good, bad, why


def _json_loads() -> Callable[[Any], Any]:
    import orjson  # 3-5x the standard library's parse

    return orjson.loads


def json_columns(values: Sequence[bytes | None]) -> dict[str, list[Any]]:
    """The JSON objects among ``values``, by field, in order of first appearance (what a
    schema is inferred from); values that are not objects are left out.

    >>> json_columns([b'{"a": 1}', b"oops", b'{"a": 2, "b": "x"}'])
    {'a': [1, 2], 'b': [None, 'x']}
    """
    loads = _json_loads()
    rows = []
    for v in values:
        try:
            row = loads(v or b"")
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    names = list(dict.fromkeys(k for r in rows for k in r))
    return {n: [r.get(n) for r in rows] for n in names}


def _csv_rows(raw: list[bytes | None], schema: TableSchema, reasons: Reasons, _: Any) -> Rows:
    names = schema.csv_columns
    width = len(names)
    wanted = {f.name for f in schema.features} | ({schema.label.name} if schema.label else set())
    rows, good, bad, why = [], [], [], []
    for i, v in enumerate(raw):
        try:
            line = (v or b"").decode("utf-8").rstrip("\r\n")
            fields = line.split(",") if '"' not in line else next(csv.reader([line]))
        except (UnicodeDecodeError, csv.Error, StopIteration):
            bad.append(i)
            why.append(reasons.code("not_csv"))
            continue
        if len(fields) != width:
            bad.append(i)
            why.append(reasons.code(f"wrong_field_count:{len(fields)}"))
            continue
        rows.append(fields)
        good.append(i)
    columns = {n: [r[k] for r in rows] for k, n in enumerate(names) if n in wanted}
    return columns, good, bad, why


def _avro_rows(
    raw: list[bytes | None], schema: TableSchema, reasons: Reasons, registry: Any
) -> Rows:
    from fastavro import schemaless_reader

    dicts, good, bad, why = [], [], [], []
    framed, expected_id = schema.framed, schema.schema_id
    # The registry's schema for each id where there is one; else the file's (its id checked).
    fixed = _parsed(schema.avro) if schema.avro is not None and not schema.registry else None
    if fixed is None and registry is None:
        from pipeline.table.registry import Registry

        registry = Registry.for_url(schema.registry)
    writers: dict[int, Any] = {}
    for i, v in enumerate(raw):
        body = v or b""
        writer = fixed
        if framed:
            if len(body) < 5 or body[0] != CONFLUENT_MAGIC:
                bad.append(i)
                why.append(reasons.code("not_confluent_avro"))
                continue
            sid = int.from_bytes(body[1:5], "big")
            if fixed is None:
                writer = writers.get(sid)
                if writer is None:
                    writer = writers[sid] = registry.writer_schema(sid)
            elif expected_id is not None and sid != expected_id:
                writer = None
            if writer is None:
                bad.append(i)
                why.append(reasons.code(f"unknown_schema_id:{sid}"))
                continue
            body = body[5:]
        d = _avro_record(body, writer, schemaless_reader)
        if d is None:
            bad.append(i)
            # Framed records read as plain ones: say so, so that the fix is one word in the schema
            # file.
            looks_framed = (
                not framed
                and len(body) > 5
                and body[0] == CONFLUENT_MAGIC
                and _avro_record(body[5:], writer, schemaless_reader) is not None
            )
            why.append(reasons.code("confluent_framed" if looks_framed else "not_avro"))
            continue
        if not isinstance(d, dict):
            bad.append(i)
            why.append(reasons.code("not_an_object"))
            continue
        dicts.append(d)
        good.append(i)
    return _columns_of(dicts, schema), good, bad, why


def _avro_record(body: bytes, writer: Any, reader: Callable[..., Any]) -> Any:
    """One Avro body by ``writer``, or None where the bytes are not one record of it."""
    try:
        buf = io.BytesIO(body)
        d = reader(buf, writer, None)
    except Exception:  # fastavro raises many kinds on bad bytes (EOFError, IndexError, ...)
        return None
    return d if buf.tell() == len(body) else None  # trailing bytes: not a record of this schema


_PARSED: dict[str, Any] = {}


def _parsed(avro: dict[str, Any]) -> Any:
    """An Avro schema parsed once per process (fastavro's parse is milliseconds)."""
    import json

    from fastavro import parse_schema

    key = json.dumps(avro, sort_keys=True)
    if key not in _PARSED:
        _PARSED[key] = parse_schema(avro)
    return _PARSED[key]


def encode_rows(rows: Sequence[dict[str, Any]], schema: TableSchema) -> np.ndarray:
    """The model's input for raw instances (what serving receives): unlabelled rows of
    named fields; raises ValueError naming the first bad field.

    >>> from pipeline.table.schema import Feature, TableSchema
    >>> encode_rows([{"a": "2"}], TableSchema((Feature("a"),), None)).tolist()
    [[2.0]]
    """
    reasons = Reasons()
    table = schema.unlabelled()
    x, _, code = _encoder(table).encode(_columns_of(list(rows), table), len(rows), reasons)
    if (code >= 0).any():
        i = int(np.flatnonzero(code >= 0)[0])
        raise ValueError(f"instance {i}: {reasons.names[code[i]]}")
    return x
