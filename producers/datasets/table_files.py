"""A table's file, read: its kind by its name, and its rows in blocks (CSV with a header,
JSON lines, Parquet, or an Avro object container file), each row with its line.

:class:`~producers.datasets.table.Table` reads a user's file through it; a row that cannot
be parsed is set aside with its line and reason, never fatal.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError, DataError
from pipeline.table.transform import GAP_TOKENS

_KINDS = {
    ".csv": "csv",
    ".gz": "csv",
    ".tsv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".avro": "avro",
}


def file_kind(path: Path) -> str:
    """``csv``, ``jsonl``, ``parquet`` or ``avro`` (an object container file), from the file's name.

    >>> file_kind(Path("a.csv.gz")), file_kind(Path("b.parquet")), file_kind(Path("c.avro"))
    ('csv', 'parquet', 'avro')
    """
    kind = _KINDS.get(path.suffix.lower())
    if kind is None:
        raise ConfigError(
            f"Expected a .csv, .csv.gz, .jsonl, .parquet or .avro file. Received: {path.name}"
        )
    return kind


def read_rows(
    path: Path, *, block_rows: int = 4096
) -> Iterator[tuple[list[int], list[dict[str, Any]], list[tuple[int, str]]]]:
    """The file's rows in blocks: ``(line of each row, rows, unparsed (line, reason))``;
    lines count from 1, a CSV's header being line 1 (a Parquet or Avro file's rows from 1)."""
    if not path.is_file():
        raise DataError(f"Expected a data file at {path}, found nothing there. Check the path.")
    kind = file_kind(path)
    if kind == "csv":
        yield from _csv_lines(path, block_rows)
    elif kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            line = 1
            for batch in pq.ParquetFile(path).iter_batches(batch_size=block_rows):
                rows = batch.to_pylist()
                yield list(range(line, line + len(rows))), rows, []
                line += len(rows)
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{path} is not a readable Parquet file ({e}).") from None
    elif kind == "avro":
        yield from _avro_records(path, block_rows)
    else:
        yield from _json_lines(path, block_rows)


def _csv_lines(
    path: Path, block_rows: int
) -> Iterator[tuple[list[int], list[dict[str, Any]], list[tuple[int, str]]]]:
    """A CSV's rows as strings by header name (gaps as None); a line with another number of
    fields than the header is set aside, not fatal (pandas would stop the whole file)."""
    import csv
    import gzip
    import io

    raw = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")  # noqa: SIM115
    with io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="") as f:
        reader = csv.reader(
            f, delimiter="\t" if path.suffix == ".tsv" else ",", skipinitialspace=True
        )
        header = next(reader, None)
        if not header:
            raise DataError(f"{path} is empty: expected a header line naming the columns.")
        header = [h.strip() for h in header]
        rows: list[dict[str, Any]] = []
        lines: list[int] = []
        bad: list[tuple[int, str]] = []
        for fields in reader:
            if len(fields) != len(header):
                if fields:
                    bad.append((reader.line_num, f"wrong_field_count:{len(fields)}"))
            else:
                rows.append(
                    {
                        h: (None if v.strip() in GAP_TOKENS else v)
                        for h, v in zip(header, fields, strict=True)
                    }
                )
                lines.append(reader.line_num)
            if len(rows) >= block_rows:
                yield lines, rows, bad
                rows, lines, bad = [], [], []
        if rows or bad:
            yield lines, rows, bad


def _json_lines(
    path: Path, block_rows: int
) -> Iterator[tuple[list[int], list[dict[str, Any]], list[tuple[int, str]]]]:
    import orjson

    with open(path, "rb") as f:
        rows: list[dict[str, Any]] = []
        lines: list[int] = []
        bad: list[tuple[int, str]] = []
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError:
                bad.append((n, "not_json"))
                continue
            if isinstance(row, dict):
                rows.append(row)
                lines.append(n)
            else:
                bad.append((n, "not_an_object"))
            if len(rows) >= block_rows:
                yield lines, rows, bad
                rows, lines, bad = [], [], []
        if rows or bad:
            yield lines, rows, bad


def _avro_records(
    path: Path, block_rows: int
) -> Iterator[tuple[list[int], list[dict[str, Any]], list[tuple[int, str]]]]:
    """An Avro object container file's records (its writer's schema is in its header)."""
    import fastavro

    with open(path, "rb") as f:
        try:
            reader = fastavro.reader(f)
        except (ValueError, EOFError) as e:  # fastavro: "cannot read header - is it an avro file?"
            raise DataError(f"{path} is not an Avro object container file ({e}).") from None
        rows: list[dict[str, Any]] = []
        line = 1
        for record in reader:
            rows.append(record if isinstance(record, dict) else {"value": record})
            if len(rows) >= block_rows:
                yield list(range(line, line + len(rows))), rows, []
                line += len(rows)
                rows = []
        if rows:
            yield list(range(line, line + len(rows))), rows, []


def avro_file_schema(path: Path) -> dict[str, Any]:
    """The writer's schema in an Avro object container file's header."""
    import fastavro

    with open(path, "rb") as f:
        try:
            found: Any = fastavro.reader(f).writer_schema
        except (ValueError, EOFError) as e:
            raise DataError(f"{path} is not an Avro object container file ({e}).") from None
    if not isinstance(found, dict):
        raise DataError(f"Expected a record schema in {path}'s header. Received: {str(found)[:80]}")
    return found
