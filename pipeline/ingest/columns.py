"""The six columns every Kafka source gives, defined once for Arrow and for Spark."""

from __future__ import annotations

from typing import Any

#: (name, Arrow type name, Spark SQL type name), in the order both sources give them.
_COLUMNS = (
    ("key", "binary", "binary"),
    ("value", "binary", "binary"),
    ("topic", "string", "string"),
    ("partition", "int32", "int"),
    ("offset", "int64", "bigint"),
    ("timestamp", "timestamp[us, UTC]", "timestamp"),
)

#: The column names, in order.
NAMES = tuple(name for name, _, _ in _COLUMNS)


def arrow_schema() -> Any:
    """The columns as a ``pyarrow.Schema`` (what executors build record batches with)."""
    import pyarrow as pa

    types = {
        "binary": pa.binary(),
        "string": pa.string(),
        "int32": pa.int32(),
        "int64": pa.int64(),
        "timestamp[us, UTC]": pa.timestamp("us", tz="UTC"),
    }
    return pa.schema([(name, types[arrow]) for name, arrow, _ in _COLUMNS])


def spark_schema() -> str:
    """The columns as a Spark DDL string.

    >>> spark_schema()
    'key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp'
    """
    return ", ".join(f"{name} {sql}" for name, _, sql in _COLUMNS)
