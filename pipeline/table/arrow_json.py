"""A block of JSON records parsed by Arrow straight into typed columns: the fast path of
:func:`pipeline.table.records.decode` for the common block, where every record is one
object whose fields have the schema's types.

Arrow's JSON reader builds columns in C++ without a Python object per field, where
a Python parse makes a dict per record and an object per value. It is exact or it
declines: a record on more than one line, an empty one, one that is not an object, a
field of another type than the schema's (a number as a string, a category as a
number) make it return None, and the block takes the record-by-record path, which
names each reject.

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
from collections.abc import Sequence
from typing import Any

from pipeline.table.schema import TableSchema

#: The smallest block worth Arrow's set-up (below it, the Python parse is as fast).
MIN_RECORDS = 64


def _arrow_schema(schema: TableSchema) -> Any:
    import pyarrow as pa

    kinds = {
        "numeric": pa.float64(),
        "categorical": pa.string(),
        "boolean": pa.bool_(),
        "id": pa.string(),  # integer IDs fail it: their blocks take the exact Python parse
    }
    fields = [pa.field(f.name, kinds[f.kind]) for f in schema.features]
    if schema.label is not None:
        fields.append(
            pa.field(schema.label.name, pa.float64() if schema.label.regression else pa.string())
        )
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
    arrow_schema = _arrow_schema(schema)
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
    return out
