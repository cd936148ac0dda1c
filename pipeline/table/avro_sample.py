"""Avro records read off a topic's first records, for ``schema infer``: plain bodies or in
Confluent's framing (told apart by reading them both ways), by the writer's schema from a
file or from a Schema Registry.

Example:
    >>> from pipeline.table.schema import Feature, Label, TableSchema, avro_schema
    >>> from pipeline.table.writers import encode_values
    >>> s = TableSchema((Feature("a"),), Label("y", ("n", "p"))).with_format("avro")
    >>> framed = encode_values([{"a": 1.5, "y": "p"}, {"a": None, "y": "n"}], s, schema_id=7)
    >>> got = read(framed, writer=avro_schema(s))
    >>> got.columns, got.framed, got.schema_id
    ({'a': [1.5, None], 'y': ['p', 'n']}, True, 7)
    >>> read(encode_values([{"a": 2.0, "y": "n"}], s), writer=avro_schema(s)).framed
    False
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from pipeline.errors import ConfigError
from pipeline.table.records import CONFLUENT_MAGIC, _avro_record, _parsed

#: The share of a sample that must read one way for the topic to be taken as written so.
MOST = 0.9


@dataclasses.dataclass(frozen=True)
class AvroSample:
    """What a sample of Avro records says.

    Attributes:
        columns: the records' fields, by name (what a schema is inferred from).
        writer: the writer's schema (JSON), where it came from a file (None: a registry's).
        framed: whether the records carry Confluent's framing.
        schema_id: the one schema id every framed record names (None: several, or unframed).
    """

    columns: dict[str, list[Any]]
    writer: dict[str, Any] | None
    framed: bool
    schema_id: int | None


def _looks_framed(v: bytes | None) -> bool:
    return v is not None and len(v) >= 5 and v[0] == CONFLUENT_MAGIC


def read(
    values: Sequence[bytes | None], *, writer: dict[str, Any] | None = None, registry: Any = None
) -> AvroSample:
    """Decode a sample of Avro values by ``writer`` (an Avro schema as JSON) or through
    ``registry`` (a :class:`~pipeline.table.registry.Registry`, for framed records)."""
    from fastavro import schemaless_reader

    present: list[bytes] = [v for v in values if v is not None]
    if not present:
        raise ConfigError("Expected Avro records to read a schema from. Received none.")
    ids = [int.from_bytes(v[1:5], "big") for v in present if _looks_framed(v)]
    if writer is None and registry is None:
        what = (
            f"the records carry Confluent's framing (schema id {ids[0]}): pass --schema-registry "
            "URL, or the writer's schema as --avro-schema FILE.avsc"
            if len(ids) >= MOST * len(present)
            else "pass the writer's schema as --avro-schema FILE.avsc (the .avsc the producer "
            "writes with)"
        )
        raise ConfigError(f"Expected a writer's schema to read Avro records: {what}.")
    parsed = _parsed(writer) if writer is not None else None
    plain = (
        [_avro_record(v, parsed, schemaless_reader) for v in present] if parsed is not None else []
    )
    framed = len(ids) >= MOST * len(present) and sum(d is not None for d in plain) < MOST * len(
        present
    )
    rows: list[Any]
    if framed:
        rows = []
        for v in present:
            sid = int.from_bytes(v[1:5], "big")
            found = registry.writer_schema(sid) if registry is not None else parsed
            rows.append(
                _avro_record(v[5:], found, schemaless_reader)
                if found is not None and _looks_framed(v)
                else None
            )
    else:
        if parsed is None:
            raise ConfigError(
                "Expected Confluent-framed records for --schema-registry. Received plain Avro "
                "bodies: pass the writer's schema as --avro-schema FILE.avsc instead."
            )
        rows = plain
    good = [r for r in rows if isinstance(r, dict)]
    if len(good) < MOST * len(present):
        raise ConfigError(
            f"Expected Avro records of the writer's schema. Received {len(present) - len(good)} "
            f"of {len(present)} that do not read by it: check --avro-schema (or the registry's "
            "schema)."
        )
    names = list(dict.fromkeys(k for r in good for k in r))
    columns = {n: [r.get(n) for r in good] for n in names}
    one_id = ids[0] if framed and ids and len(set(ids)) == 1 else None
    return AvroSample(columns, writer, framed, one_id)
