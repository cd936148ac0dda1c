"""A block of JSON records parsed by Arrow straight into typed columns: the fast path of
:func:`pipeline.table.records.decode` for the common block, where every record is one
object whose fields have the schema's types.

Arrow's JSON reader builds columns in C++ without a Python object per field, where
a Python parse makes a dict per record and an object per value. It is exact or it
declines: a record on more than one line, an empty one, one that is not an object, a
field of another type than the schema's (a number as a string, a category as a
number) make it return None, and the block takes the record-by-record path, which
names each reject. A class label or an ID that the block's first record writes as a
number (``"clicked": 0``, ``"user": 42``) is read as a number in the whole block: a
later record that writes it as text sends the block to the careful path.

Example:
    >>> from pipeline.table.schema import Feature, Label, TableSchema
    >>> s = TableSchema(
    ...     (Feature("a"), Feature("c", "categorical", vocabulary=("x",))), Label("y", ("n", "p"))
    ... )
    >>> cols = columns(
    ...     [b'{"a": 1.5, "c": "x", "y": "p"}', b'{"a": null, "y": "n", "extra": 1}'],
    ...     s,
    ...     min_records=1,
    ... )
    >>> cols["a"].tolist(), cols["c"], cols["y"]
    ([1.5, nan], ['x', None], ['p', 'n'])
    >>> columns(
    ...     [b'{"a": "1.5", "y": "p"}'], s, min_records=1
    ... ) is None  # a number as text: the careful path
    True
    >>> columns(
    ...     [b'{"a": NaN, "y": "p"}'], s, min_records=1
    ... ) is None  # no JSON: rejected as not_json there
    True
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.table.schema import TableSchema

#: The smallest block worth Arrow's set-up (below it, the Python parse is as fast).
MIN_RECORDS = 64
#: Beyond it a float64 no longer holds every integer: a class label written as such a number
#: takes the careful path, which keeps its every digit.
_EXACT = 2.0**53


def _numbers(first: bytes, schema: TableSchema) -> frozenset[str]:
    """The ID fields and the class label that the record ``first`` writes as JSON numbers
    (integers, for an ID), which Arrow then reads as numbers.

    >>> from pipeline.table.schema import Feature, Label
    >>> ids = (Feature("u", "id", dim=4), Feature("v", "id", dim=4))
    >>> s = TableSchema(ids, Label("y", ("0", "1")))
    >>> sorted(_numbers(b'{"u": 7, "v": "b", "y": 1}', s)), sorted(_numbers(b'{"u": 7.5}', s))
    (['u', 'y'], [])
    """
    try:
        record = json.loads(first)
    except ValueError:
        return frozenset()
    if not isinstance(record, dict):
        return frozenset()
    # type(), not isinstance: true and false are ints to isinstance, and no numbers here
    kinds: dict[str, tuple[type, ...]] = {f.name: (int,) for f in schema.features if f.kind == "id"}
    if schema.label is not None and not schema.label.regression:
        kinds[schema.label.name] = (int, float)
    return frozenset(n for n, kind in kinds.items() if type(record.get(n)) in kind)


def _arrow_schema(schema: TableSchema, numbers: frozenset[str] = frozenset()) -> Any:
    import pyarrow as pa

    kinds = {
        "numeric": pa.float64(),
        "categorical": pa.string(),
        "boolean": pa.bool_(),
        "id": pa.string(),
    }
    fields = [
        pa.field(f.name, pa.int64() if f.name in numbers else kinds[f.kind])
        for f in schema.features
    ]
    if schema.label is not None:
        label = schema.label
        number = label.regression or label.name in numbers
        fields.append(pa.field(label.name, pa.float64() if number else pa.string()))
    return pa.schema(fields)


def columns(
    raw: Sequence[bytes | None], schema: TableSchema, *, min_records: int = MIN_RECORDS
) -> dict[str, Any] | None:
    """The records' fields by column (numbers as float64 arrays, gaps NaN; the rest as
    Python lists, gaps None), or None where Arrow cannot read the block exactly."""
    import pyarrow as pa
    import pyarrow.json as pj

    if len(raw) < min_records or not all(raw):
        return None
    data = b"\n".join(raw)  # type: ignore[arg-type]
    if (
        data.count(b"\n") != len(raw) - 1
    ):  # a record holding a line break: lines would not be records
        return None
    if (
        b"NaN" in data or b"Infinity" in data
    ):  # Arrow reads these constants; JSON has none (they are not_json)
        return None
    numbers = _numbers(raw[0], schema)  # type: ignore[arg-type]
    arrow_schema = _arrow_schema(schema, numbers)
    try:
        table = pj.read_json(
            io.BytesIO(data),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 1),
            parse_options=pj.ParseOptions(
                explicit_schema=arrow_schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(raw):
        return None
    out: dict[str, Any] = {}
    for field in arrow_schema:
        column = table.column(field.name).combine_chunks()
        out[field.name] = (
            column.to_numpy(zero_copy_only=False)
            if pa.types.is_floating(field.type)
            else column.to_pylist()
        )
    label = schema.label
    if (
        label is not None
        and label.name in numbers
        and np.nanmax(np.abs(out[label.name]), initial=0.0) >= _EXACT
    ):
        return None
    return out
