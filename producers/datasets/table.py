"""A user's own table: a CSV (with a header), JSON lines or Parquet file, read by a schema.

The schema is the one given, or one inferred from the file's first rows. Rows go out
as they are in the file (strings and gaps included), in the schema's record format,
so the stream applies the transform, as it does to a topic fed by anyone else; a
row the schema cannot encode is counted with its line, column and reason, and not
sent. A fixed share of the rows, picked by a hash of the row's 0-based index (the same
row of the same table in any file format), is held out: the ``test`` split, never
replayed, scores the model.

Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
    >>> _ = path.write_text("kind,size,color\\na,1.5,red\\nb,NA,blue\\nb,2,\\nc,oops,red\\n")
    >>> t = Table(path, label="kind", holdout=0.0)
    >>> [(f.name, f.kind) for f in t.table.features], t.table.label.classes
    ([('size', 'categorical'), ('color', 'categorical')], ('a', 'b', 'c'))
    >>> for c in t.iter_chunks():
    ...     print(*c.values, sep="\\n")
    b'{"kind":"a","size":"1.5","color":"red"}'
    b'{"kind":"b","size":null,"color":"blue"}'
    b'{"kind":"b","size":"2","color":null}'
    b'{"kind":"c","size":"oops","color":"red"}'
    >>> schema = TableSchema.from_dict({
    ...     "features": [{"name": "size"},
    ...                  {"name": "color", "kind": "categorical", "vocabulary": ["red"]}],
    ...     "label": {"name": "kind", "classes": ["a", "b"]}})
    >>> t = Table(path, label="kind", holdout=0.0, schema=schema)
    >>> for c in t.iter_chunks():
    ...     print(*c.values, sep="\\n")
    b'{"kind":"a","size":1.5,"color":"red"}'
    b'{"kind":"b","size":null,"color":"blue"}'
    b'{"kind":"b","size":2.0,"color":null}'
    >>> t.malformed_examples
    [(5, 'not_a_number:size')]
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import codec
from pipeline.errors import ConfigError, DataError
from pipeline.table.inference import infer, mixed_columns
from pipeline.table.records import _encoder
from pipeline.table.schema import TableSchema
from pipeline.table.transform import GAP_TOKENS, Reasons
from pipeline.table.writers import encode_values
from producers.datasets import table_files
from producers.datasets.base import Chunk, Dataset, check_split

log = logging.getLogger(__name__)

#: Sample tables that ship with the package (their PROVENANCE.md says whence and under what
#: licence).
SAMPLES = Path(__file__).parent / "samples"
#: Rows read to infer a schema.
INFER_ROWS = 10_000


def nested_columns(path: Path) -> dict[str, str]:
    """A Parquet file's columns that hold lists, structs or maps, with their types (a
    model's input is flat: such a column is refused by name, never hashed as a category).

    Other files: their nested values are found when a schema is inferred."""
    if table_files.file_kind(path) != "parquet" or not path.is_file():
        return {}
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{path} is not a readable Parquet file ({e}).") from None
    return {f.name: str(f.type) for f in schema if pa.types.is_nested(f.type)}


def check_flat(path: Path, names: set[str]) -> None:
    """Refuse, in one line, the nested columns among ``names``."""
    nested = {n: t for n, t in nested_columns(path).items() if n in names}
    if nested:
        listed = ", ".join(f"{n!r} ({t})" for n, t in nested.items())
        raise ConfigError(
            f"Expected flat columns (numbers, strings, booleans) in {path.name}. "
            f"Received nested ones: {listed}. Flatten them into columns of their own, or leave "
            "them out (--ignore COLUMN, or drop them from the schema)."
        )


def check_rows(path: Path) -> None:
    """Raise :class:`DataError` for a file with no row to read (before anything starts)."""
    unparsed: list[tuple[int, str]] = []
    for _, rows, bad in table_files.read_rows(path, block_rows=64):
        if rows:
            return
        unparsed += bad
    detail = (
        f" ({len(unparsed)} malformed: line {unparsed[0][0]}: {unparsed[0][1]}, ...)"
        if unparsed
        else ""
    )
    raise DataError(f"Expected rows in {path}. Received none{detail}. Check the file.")


def sample_columns(path: Path, rows: int = INFER_ROWS) -> dict[str, list[Any]]:
    """The first ``rows`` rows of a file, by column (what a schema is inferred from)."""
    columns: dict[str, list[Any]] = {}
    seen = 0
    for _, block, _ in table_files.read_rows(path):
        for row in block[: rows - seen]:
            for name in row:
                columns.setdefault(name, [None] * seen)
            for name, values in columns.items():
                values.append(row.get(name))
            seen += 1
        if seen >= rows:
            break
    if not columns:
        raise DataError(f"{path} holds no rows to read a schema from.")
    return columns


def held_out(ids: np.ndarray, share: float) -> np.ndarray:
    """Which records a fixed share holds out, by a hash of their id: spread over the whole
    file, the same on every run.

    >>> int(held_out(np.arange(10_000, dtype=np.uint64), 0.1).sum())
    998
    """
    if share <= 0:
        return np.zeros(len(ids), bool)
    mixed = (np.asarray(ids, np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
    return (mixed % np.uint64(10_000)) < np.uint64(round(share * 10_000))


class Table(Dataset):
    """A user's table file, by a schema.

    Args:
        path: the CSV, JSON lines or Parquet file.
        label: the target column (to infer the schema; checked against a given one).
        schema: a schema file or :class:`~pipeline.table.TableSchema`; None: inferred.
        holdout: the share of rows held out as the test split.
        format: the records' format on the topic (``json``, ``csv``, ``avro``).
        name: the dataset's name (default: the file's stem).
    """

    name = "table"
    options = ("label", "schema", "holdout", "format")

    def __init__(
        self,
        path: str | Path,
        *,
        label: str | None = None,
        schema: str | Path | TableSchema | None = None,
        holdout: float = 0.1,
        format: str | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        table_files.file_kind(self.path)
        if not 0 <= holdout < 1:
            raise ConfigError(f"Expected --holdout in [0, 1). Received: {holdout}")
        self.holdout = holdout
        if schema is None:
            if label is None:
                raise ConfigError(
                    f"Expected --label COLUMN (the target) or --schema FILE for {self.path.name}."
                )
            columns = sample_columns(self.path)
            table = infer(columns, label=label)
            for mixed in mixed_columns(columns, table):
                log.warning(
                    "%s: %s (and a --schema FILE written by `streamtrain schema infer`)",
                    self.path.name,
                    mixed.line(),
                )
        else:
            table = schema if isinstance(schema, TableSchema) else TableSchema.load(schema)
            if label is not None and (table.label is None or table.label.name != label):
                raise ConfigError(
                    f"Expected --label to match the schema's label "
                    f"{table.label.name if table.label else None!r}. Received: {label!r}"
                )
            check_rows(
                self.path
            )  # an empty file is one line now, not a run that starts and finds nothing
        check_flat(
            self.path,
            {f.name for f in table.features} | ({table.label.name} if table.label else set()),
        )
        if format is not None and format != table.format:
            table = table.with_format(format)
        self.table = table
        self.name = name or self.path.name.split(".")[0]
        self.schema = codec.table(self.name, table)
        #: Another file whose every row is the test split instead of a held-out share
        #: (``--eval-data``), read by this table's schema.
        self.eval_rows: Table | None = None

    def iter_chunks(self, split: str = "train", *, chunk_rows: int = 4096) -> Iterator[Chunk]:
        check_split(split)
        if split == "test" and self.eval_rows is not None:
            yield from self.eval_rows.iter_chunks("train", chunk_rows=chunk_rows)
            return
        encoder = _encoder(self.table)
        index = 0
        for lines, rows, unparsed in table_files.read_rows(self.path, block_rows=chunk_rows):
            # A row's id (its Kafka key) is its 0-based index among the file's rows: the same row
            # of the same table has the same id, and so the same held-out fate, in every format
            # (a CSV's line numbers start after its header, a Parquet file's rows at 0).
            ids = np.arange(index, index + len(rows), dtype=np.uint64)
            index += len(rows)
            keep = held_out(ids, self.holdout) == (split == "test")
            rows = [r for r, k in zip(rows, keep, strict=True) if k]
            ids, kept_lines = ids[keep], np.array(lines, np.int64)[keep]
            columns = {n: [r.get(n) for r in rows] for n in self._names()}
            reasons = Reasons()
            x, y, code = encoder.encode(columns, len(rows), reasons)
            ok = code < 0
            self.rows_read += len(rows) + (len(unparsed) if split == "train" else 0)
            self.reject(
                sorted(
                    [
                        *(unparsed if split == "train" else []),
                        *(
                            (int(n), reasons.names[c])
                            for n, c in zip(kept_lines[~ok], code[~ok], strict=True)
                        ),
                    ]
                )
            )
            if ok.any():
                good = self._typed([r for r, k in zip(rows, ok, strict=True) if k])
                yield Chunk(ids[ok], x[ok], y[ok], values=encode_values(good, self.table))

    def _typed(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Rows as they go on the wire: a numeric column's values as numbers (a CSV's are
        text), gaps as null; the rest as in the file."""
        t = self.table
        numeric = [f.name for f in t.features if f.kind == "numeric"] + (
            [t.label.name] if t.label and t.regression else []
        )
        names = self._names()
        out = []
        for row in rows:
            row = {k: v for k, v in row.items() if k in names}
            for name in numeric:
                v = row.get(name)
                if isinstance(v, str):
                    number = float(v) if v.strip() not in GAP_TOKENS else None
                    row[name] = None if number is None or number != number else number
            out.append(row)
        return out

    def _names(self) -> set[str]:
        t = self.table
        return {f.name for f in t.features} | ({t.label.name} if t.label else set())

    def describe(self) -> dict[str, Any]:
        """What the report says of the data."""
        return {"path": str(self.path), "holdout": self.holdout, "schema": self.table.to_dict()}
