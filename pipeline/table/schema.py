"""A table's schema: its features and their kinds, its label, and its records' format.

One small JSON file (``schema.json``) that a user reads and edits, written by
``streamtrain schema infer``. It names every feature with its kind and how it is
encoded into the model's input, and the label (class names, or a numeric target
for regression). It travels in a run's ``model.json``, so serving applies the very
transform training did.

Example:
    >>> s = TableSchema.from_dict({
    ...     "format": "json",
    ...     "features": [
    ...         {"name": "size", "kind": "numeric", "fill": 2.0, "scale": [2.0, 0.5]},
    ...         {"name": "color", "kind": "categorical", "vocabulary": ["red", "blue"]},
    ...         {"name": "new", "kind": "boolean"}],
    ...     "label": {"name": "kind", "classes": ["a", "b", "c"]}})
    >>> s.width, s.num_classes, s.columns()
    (5, 3, ['size', 'color_<other>', 'color=red', 'color=blue', 'new'])
    >>> TableSchema.from_json(s.to_json()) == s
    True
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from pipeline.table.id_settings import ROW_LEARNING_RATE

#: The kinds of feature, and how a categorical one reaches the model.
KINDS = ("numeric", "categorical", "boolean", "id")
#: Float32 lanes an ID takes in a decoded block (:mod:`pipeline.table.ids`).
ID_LANES = 3
ENCODINGS = ("one_hot", "index")
#: Record formats a table's topic may carry.
FORMATS = ("json", "csv", "avro")
#: How Avro records sit in a Kafka value: the body alone, or Confluent's framing (a zero
#: byte and the writer schema's id before the body).
WIRES = ("plain", "confluent")
#: What a missing value becomes: a fill value (numeric, boolean), the out-of-vocabulary
#: slot (categorical), or a reject of the record.
MISSING = ("fill", "reject")


def _fail(where: str, expected: str, received: Any) -> ConfigError:
    return ConfigError(
        f"Expected {expected} in the schema's {where}. Received: {received!r}. Edit the schema "
        "file, or write a fresh one with `streamtrain schema infer`."
    )


@dataclasses.dataclass(frozen=True)
class Feature:
    """One input column and its encoding.

    Attributes:
        name: the column (a JSON field, a CSV header name, an Avro field).
        kind: ``numeric``, ``categorical`` or ``boolean``.
        missing: ``fill`` or ``reject`` (a categorical fills the out-of-vocabulary slot).
        fill: a numeric or boolean feature's value where it is missing.
        scale: numeric: ``(center, scale)``: the model sees ``(value - center) * scale``.
        vocabulary: categorical: the known values; anything else (and a gap) is slot 0.
        hash_buckets: categorical without a vocabulary: ``crc32(value) % N + 1`` (0: a gap).
        encoding: categorical: ``one_hot`` (width vocabulary + 1) or ``index`` (width 1,
            for an embedding layer).
        dim, min_count, ttl, table, optimizer, learning_rate: id: its row's size, the
            sightings before an ID gets a row of its own, the records after which an unseen
            ID's row goes (None: never), the table (default: the feature's name; features
            may share one), how its rows learn (:mod:`pipeline.table.id_settings`).
    """

    name: str
    kind: str = "numeric"
    missing: str = "fill"
    fill: float = 0.0
    scale: tuple[float, float] = (0.0, 1.0)
    vocabulary: tuple[str, ...] = ()
    hash_buckets: int = 0
    encoding: str = "one_hot"
    dim: int = 0
    min_count: int = 1
    ttl: int | None = None
    table: str = ""
    optimizer: str = "adagrad"
    learning_rate: float = ROW_LEARNING_RATE

    @property
    def width(self) -> int:
        """Columns this feature takes in a decoded block (an ID: its key's lanes)."""
        if self.kind == "id":
            return ID_LANES
        if self.kind != "categorical" or self.encoding == "index":
            return 1
        return self.slots

    @property
    def slots(self) -> int:
        """Categorical: distinct indices, the out-of-vocabulary slot 0 included."""
        return (len(self.vocabulary) or self.hash_buckets) + 1

    def columns(self) -> list[str]:
        """Names of the input columns it takes (an ID: its key's lanes)."""
        if self.kind == "id":
            return [f"{self.name}#key{i}" for i in range(ID_LANES)]
        if self.width == 1:
            return [self.name]
        names = list(self.vocabulary) or [f"#{i}" for i in range(self.hash_buckets)]
        return [f"{self.name}_<other>", *(f"{self.name}={v}" for v in names)]

    def check(self) -> None:
        where = f"feature {self.name!r}"
        if self.kind not in KINDS:
            raise _fail(where, f"kind in {KINDS}", self.kind)
        if self.missing not in MISSING:
            raise _fail(where, f"missing in {MISSING}", self.missing)
        if self.kind == "categorical":
            if self.encoding not in ENCODINGS:
                raise _fail(where, f"encoding in {ENCODINGS}", self.encoding)
            if bool(self.vocabulary) == bool(self.hash_buckets):
                raise _fail(where, "either a vocabulary or hash_buckets >= 1", self.hash_buckets)
            if len(set(self.vocabulary)) != len(self.vocabulary):
                raise _fail(where, "a vocabulary without repeats", list(self.vocabulary))
        if self.kind == "id" or self.dim or self.table:
            from pipeline.table.id_settings import check_id

            check_id(self, lambda expected, got: _fail(where, expected, got))
        if self.kind == "numeric" and (len(self.scale) != 2 or self.scale[1] == 0):
            raise _fail(
                where, "scale [center, factor] with a factor other than 0", list(self.scale)
            )


@dataclasses.dataclass(frozen=True)
class Label:
    """The target column: ``classes`` names the classes in index order; without them the
    target is numeric (regression), ``scale`` its ``(center, spread)`` (the default model's
    output layer is scaled by it, so it starts near the target's mean)."""

    name: str
    classes: tuple[str, ...] = ()
    scale: tuple[float, float] = (0.0, 1.0)

    @property
    def regression(self) -> bool:
        return not self.classes


@dataclasses.dataclass(frozen=True)
class TableSchema:
    """The features, the label and the record format of one table or topic.

    Attributes:
        features: the inputs, in the order the model sees them.
        label: the target, or None for unlabelled instances (what serving receives).
        format: the records' format on the topic: ``json``, ``csv`` or ``avro``.
        csv_columns: ``csv``: every field of a line, in order (the label's too).
        avro: ``avro``: the writer's schema (a JSON object); with ``registry`` the
            records carry the Confluent wire format (magic byte, schema id) instead.
        registry: the Schema Registry's URL, for the Confluent wire format.
        wire: ``avro``: ``plain`` bodies, or ``confluent`` framing (implied by ``registry``);
            framed records without a registry are read by the file's ``avro`` schema.
        schema_id: ``confluent`` without a registry: the id the file's schema has in the
            records' framing (a record naming another id is rejected); None: any id.
    """

    features: tuple[Feature, ...]
    label: Label | None
    format: str = "json"
    csv_columns: tuple[str, ...] = ()
    avro: dict[str, Any] | None = dataclasses.field(default=None, hash=False, compare=False)
    registry: str | None = None
    wire: str = "plain"
    schema_id: int | None = None

    def __post_init__(self) -> None:
        if not self.features:
            raise _fail("features", "at least one feature", [])
        names = [f.name for f in self.features]
        if len(set(names)) != len(names):
            raise _fail("features", "each name once", names)
        for f in self.features:
            f.check()
        if self.ids:
            from pipeline.table.id_settings import check_tables

            check_tables(self.ids, lambda where, expected, got: _fail(where, expected, got))
        if self.label is not None and self.label.name in names:
            raise _fail("label", "a column that is not also a feature", self.label.name)
        if self.format not in FORMATS:
            raise _fail("format", f"one of {FORMATS}", self.format)
        if self.format == "csv":
            missing = [
                n
                for n in [*names, *([self.label.name] if self.label else [])]
                if n not in self.csv_columns
            ]
            if missing:
                raise _fail(
                    "csv_columns",
                    f"every feature and the label among them ({missing} are not)",
                    list(self.csv_columns),
                )
        if self.format == "avro" and self.avro is None and not self.registry:
            raise _fail(
                "avro",
                "the writer's Avro schema, or a Schema Registry (--schema-registry URL)",
                None,
            )
        if self.wire not in WIRES:
            raise _fail("wire", f"one of {WIRES}", self.wire)
        if self.schema_id is not None and (
            not isinstance(self.schema_id, int) or self.schema_id < 0
        ):
            raise _fail("schema_id", "the writer schema's id, a whole number >= 0", self.schema_id)

    @property
    def framed(self) -> bool:
        """Whether Avro records carry Confluent's framing (magic byte, schema id)."""
        return self.format == "avro" and (self.wire == "confluent" or bool(self.registry))

    @property
    def width(self) -> int:
        """Columns of the model's input."""
        return sum(f.width for f in self.features)

    @property
    def ids(self) -> tuple[Feature, ...]:
        """The ID features, in order."""
        return tuple(f for f in self.features if f.kind == "id")

    @property
    def model_width(self) -> int:
        """Columns of the model's input: an ID feature gives its row's ``dim``."""
        return sum(f.dim if f.kind == "id" else f.width for f in self.features)

    @property
    def num_classes(self) -> int:
        """Classes of the label; 0 for a numeric target (or no label)."""
        return len(self.label.classes) if self.label is not None else 0

    @property
    def regression(self) -> bool:
        return self.label is not None and self.label.regression

    def columns(self) -> list[str]:
        """The name of each input column, in order."""
        return [c for f in self.features for c in f.columns()]

    def decode(self, values: Any) -> Any:
        """Kafka values of this table to a :class:`pipeline.codec.Decoded` (see
        :func:`pipeline.table.records.decode`)."""
        from pipeline.table import records

        return records.decode(values, self)

    def unlabelled(self) -> TableSchema:
        """The same features without the label: what a prediction request carries."""
        return dataclasses.replace(self, label=None)

    def with_format(self, format: str, *, registry: str | None = None) -> TableSchema:
        """The same table in another record format (``csv`` lines keep the features' order)."""
        columns = self.csv_columns or tuple(f.name for f in self.features) + (
            (self.label.name,) if self.label else ()
        )
        registry = registry or self.registry
        avro = (
            self.avro
            if self.avro is not None or format != "avro" or registry
            else avro_schema(self)
        )
        return dataclasses.replace(
            self,
            format=format,
            csv_columns=columns if format == "csv" else self.csv_columns,
            registry=registry,
            avro=avro,
        )

    # --- files ---

    def to_dict(self) -> dict[str, Any]:
        features = []
        for f in self.features:
            d: dict[str, Any] = {"name": f.name, "kind": f.kind}
            if f.kind == "numeric":
                d.update(missing=f.missing, fill=f.fill, scale=list(f.scale))
            elif f.kind == "id":
                from pipeline.table.id_settings import id_dict

                d.update(id_dict(f))
            elif f.kind == "categorical":
                d.update(missing=f.missing, encoding=f.encoding)
                d.update(
                    {"vocabulary": list(f.vocabulary)}
                    if f.vocabulary
                    else {"hash_buckets": f.hash_buckets}
                )
            else:
                d.update(missing=f.missing, fill=f.fill)
            features.append(d)
        out: dict[str, Any] = {"format": self.format, "features": features}
        if self.label is not None:
            out["label"] = (
                {"name": self.label.name, "classes": list(self.label.classes)}
                if self.label.classes
                else {"name": self.label.name, "kind": "numeric", "scale": list(self.label.scale)}
            )
        if self.csv_columns:
            out["csv_columns"] = list(self.csv_columns)
        if self.avro is not None:
            out["avro"] = self.avro
        if self.registry:
            out["registry"] = self.registry
        if self.wire != "plain":
            out["wire"] = self.wire
        if self.schema_id is not None:
            out["schema_id"] = self.schema_id
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, d: Any) -> TableSchema:
        """Read :meth:`to_dict`; every mistake is one :class:`ConfigError` line."""
        if not isinstance(d, dict) or not isinstance(d.get("features"), list):
            raise _fail("top level", 'an object with "features": [...]', type(d).__name__)
        features = []
        for raw in d["features"]:
            if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
                raise _fail("features", 'objects with a "name"', raw)
            known = {f.name for f in dataclasses.fields(Feature)}
            unknown = sorted(set(raw) - known)
            if unknown:
                raise _fail(f"feature {raw['name']!r}", f"keys among {sorted(known)}", unknown)
            kw = dict(raw)
            if "scale" in kw:
                kw["scale"] = tuple(float(v) for v in kw["scale"])
            if "vocabulary" in kw:
                kw["vocabulary"] = tuple(str(v) for v in kw["vocabulary"])
            features.append(Feature(**kw))
        label = None
        raw_label = d.get("label")
        if raw_label is not None:
            if not isinstance(raw_label, dict) or not isinstance(raw_label.get("name"), str):
                raise _fail("label", 'an object with a "name"', raw_label)
            classes = tuple(str(c) for c in raw_label.get("classes") or ())
            if (
                raw_label.get("kind", "numeric" if not classes else "class") == "numeric"
                and classes
            ):
                raise _fail("label", "classes, or kind numeric, not both", raw_label)
            scale = tuple(float(v) for v in raw_label.get("scale", (0.0, 1.0)))
            if len(scale) != 2 or scale[1] <= 0:
                raise _fail(
                    "label", "scale [center, spread] with a spread above 0", raw_label.get("scale")
                )
            label = Label(raw_label["name"], classes, scale)
        return cls(
            tuple(features),
            label,
            format=d.get("format", "json"),
            csv_columns=tuple(d.get("csv_columns") or ()),
            avro=d.get("avro"),
            registry=d.get("registry"),
            wire=d.get("wire", "plain"),
            schema_id=d.get("schema_id"),
        )

    @classmethod
    def from_json(cls, text: str) -> TableSchema:
        return cls.from_dict(json.loads(text))

    @classmethod
    def load(cls, path: str | Path) -> TableSchema:
        """A schema file, with one line for a missing or malformed one."""
        p = Path(path)
        if not p.is_file():
            raise ConfigError(
                f"Expected a schema file at {p}; there is none. Write one with "
                "`streamtrain schema infer DATA --label COLUMN -o schema.json`."
            )
        try:
            return cls.from_json(p.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"Expected JSON in the schema file {p}. Received: {e.msg} at line {e.lineno}."
            ) from None
        except (TypeError, ValueError) as e:  # a ConfigError too: say which file
            raise ConfigError(f"{p}: {e}") from None


def avro_schema(schema: TableSchema, *, name: str = "Record") -> dict[str, Any]:
    """An Avro record schema for the table's rows (:func:`pipeline.table.writers.writer_schema`)."""
    from pipeline.table.writers import writer_schema

    return writer_schema(schema, name=name)
