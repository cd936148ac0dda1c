"""Streaming CSV of numbers: blocks of rows parsed by numpy, bad rows counted, never fatal."""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipeline.errors import DataError


def open_text(path: Path) -> io.TextIOBase:
    """Open a ``.csv`` or ``.csv.gz`` for reading text, with a clear error when missing."""
    if not path.is_file():
        raise DataError(f"Expected a CSV file at {path}, found nothing there. Check the path or --data-dir.")
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", errors="replace")
    return open(path, encoding="utf-8", errors="replace")  # noqa: SIM115


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def read_header(first_line: str) -> list[str] | None:
    """Column names if ``first_line`` is a header (a field that is not a number), else None.

    >>> read_header("label,a,b")
    ['label', 'a', 'b']
    >>> read_header("1.0,2,3") is None
    True
    """
    fields = [f.strip() for f in first_line.strip().split(",")]
    return None if all(_is_number(f) for f in fields if f) else fields


def _parse_rows(lines: list[str], n_cols: int) -> tuple[np.ndarray, int]:
    """Parse lines into a float64 ``(n, n_cols)`` array; return it and the count of bad lines."""
    import pandas as pd  # its C parser is ~1.6x numpy.loadtxt here and releases the GIL

    try:
        frame = pd.read_csv(io.StringIO("".join(lines)), header=None, dtype=np.float64, engine="c")
        if frame.shape[1] == n_cols and len(frame) == len(lines):
            return frame.to_numpy(), 0
    except (ValueError, pd.errors.ParserError):
        pass
    # Slow path, only for a block holding a bad line: find which lines are bad.
    good: list[list[float]] = []
    for line in lines:
        fields = line.split(",")
        if len(fields) != n_cols:
            continue
        try:
            good.append([float(f) for f in fields])
        except ValueError:
            continue
    return np.array(good, np.float64).reshape(len(good), n_cols), len(lines) - len(good)


def iter_numeric_rows(
    path: Path, *, block_rows: int = 8192, skip_rows: int = 0, max_rows: int | None = None
) -> Iterator[tuple[np.ndarray, int, list[str] | None]]:
    """Yield ``(rows, n_bad, header)`` per block: float64 rows of a numeric CSV.

    The header is detected from the first line. Blank lines are ignored; lines
    with the wrong number of fields or a non-number count as bad. ``skip_rows``
    and ``max_rows`` count data lines (good or bad), for splitting one file.
    """
    with open_text(path) as f:
        first = f.readline()
        if not first:
            return
        header = read_header(first)
        n_cols = len(header) if header else len(first.split(","))
        pending = [] if header else [first]
        seen = 0
        exhausted = False
        while not exhausted:
            lines = pending
            pending = []
            while len(lines) < block_rows:
                line = f.readline()
                if not line:
                    exhausted = True
                    break
                if line.strip():
                    lines.append(line)
            lines = [line for line in lines if line.strip()]
            # Apply the row window on data lines, so train/test splits of one file are exact.
            start = max(0, skip_rows - seen)
            stop = len(lines) if max_rows is None else max(0, min(len(lines), skip_rows + max_rows - seen))
            seen += len(lines)
            window = lines[start:stop]
            if window:
                rows, bad = _parse_rows(window, n_cols)
                yield rows, bad, header
            if max_rows is not None and seen >= skip_rows + max_rows:
                return


def finite_rows(rows: np.ndarray) -> np.ndarray:
    """Mask of rows whose every value is finite."""
    if not len(rows):
        return np.ones(0, bool)
    result: np.ndarray = np.isfinite(rows).all(axis=1)
    return result


def check_columns(header: list[str] | None, wanted: str, path: Path) -> int:
    """Index of column ``wanted`` in ``header``, or a clear error."""
    if header is None:
        raise DataError(f"Expected a header row in {path} naming a {wanted!r} column. Received: no header.")
    if wanted not in header:
        raise DataError(f"Expected a column {wanted!r} in {path}. Received columns: {header}. Pass --label-column.")
    return header.index(wanted)
