"""Raw column values to the model's input: the one transform training and serving share.

Columns go through numpy one feature at a time, so a block of records costs a
few list passes per feature, not a Python branch per value; the slow path runs
only for a column holding something numpy cannot read (a gap token, a string).
A record that cannot be encoded is rejected with a reason naming the field
(``missing:island``, ``not_a_number:bill_length_mm``), the first that applies.

Example:
    >>> from pipeline.table.schema import Feature, Label, TableSchema
    >>> s = TableSchema(
    ...     (Feature("x", scale=(1.0, 2.0)), Feature("c", "categorical", vocabulary=("a", "b"))),
    ...     Label("y", ("no", "yes")),
    ... )
    >>> reasons = Reasons()
    >>> x, y, code = Encoder(s).encode(
    ...     {"x": [2, "NA", "oops"], "c": ["b", "z", "a"], "y": ["yes", "no", "no"]}, 3, reasons
    ... )
    >>> (
    ...     x.tolist(),
    ...     y.tolist(),
    ...     [reasons.names[c] if c >= 0 else "ok" for c in code],
    ... )  # doctest: +NORMALIZE_WHITESPACE
    ([[2.0, 0.0, 0.0, 1.0], [-2.0, 1.0, 0.0, 0.0], [-2.0, 0.0, 1.0, 0.0]], [1, 0, 0], ['ok', 'ok',
    'not_a_number:x'])
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipeline.table.schema import Feature, TableSchema

#: Strings that mean "no value" in a file (pandas's and R's usual ones).
GAP_TOKENS = frozenset(
    {"", "NA", "N/A", "NaN", "nan", "null", "NULL", "None", "none", "#N/A", "-", "?"}
)
_TRUE = {True: 1.0, "true": 1.0, "t": 1.0, "yes": 1.0, "y": 1.0, "1": 1.0}  # True == 1 as a key
_FALSE = {False: 0.0, "false": 0.0, "f": 0.0, "no": 0.0, "n": 0.0, "0": 0.0}
#: float32's largest finite value: anything beyond it would reach the model as infinity.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class Reasons:
    """Reject reasons met so far, numbered in order: a code per record, a name per code."""

    def __init__(self, names: Sequence[str] = ()) -> None:
        self.names: list[str] = list(names)
        self._index = {n: i for i, n in enumerate(self.names)}

    def code(self, name: str) -> int:
        if name not in self._index:
            self._index[name] = len(self.names)
            self.names.append(name)
        return self._index[name]


def text(value: Any) -> str | None:
    """A categorical value as the text a vocabulary holds (None for a gap).

    >>> text(3.0), text(" Dream "), text("NA"), text(True)
    ('3', 'Dream', None, 'true')
    """
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    out = str(value).strip()
    return None if out in GAP_TOKENS else out


def numbers(values: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Values as float64 (gaps as NaN) and a mask of those that are not numbers.

    >>> v, bad = numbers([1, None, "2.5", "NA", "x", float("inf")])
    >>> v.tolist()[:3], bad.tolist()
    ([1.0, nan, 2.5], [False, False, False, False, True, False])
    """
    try:
        out = np.array(values, dtype=np.float64)
        if out.ndim == 1:
            return out, np.zeros(len(out), bool)
    except (ValueError, TypeError):
        pass
    out = np.empty(len(values), np.float64)
    bad = np.zeros(len(values), bool)
    for i, v in enumerate(values):
        if v is None or (isinstance(v, str) and v.strip() in GAP_TOKENS):
            out[i] = np.nan
            continue
        try:
            out[i] = float(v)
        except (ValueError, TypeError):
            out[i], bad[i] = np.nan, True
    return out, bad


class _Column:
    """One feature's encoder, its lookups built once per schema."""

    def __init__(self, feature: Feature, start: int) -> None:
        self.f, self.start = feature, start
        if feature.vocabulary:
            self.lookup: dict[Any, int] = {v: i + 1 for i, v in enumerate(feature.vocabulary)}

    def encode(
        self, values: Sequence[Any], out: np.ndarray, code: np.ndarray, reasons: Reasons
    ) -> None:
        f = self.f
        if f.kind == "numeric":
            v, bad = numbers(values)
            gap = np.isnan(v) & ~bad
            v[gap | bad] = f.fill
            v = (v - f.scale[0]) * f.scale[1]
            huge = ~np.isfinite(v) | (np.abs(v) > _FLOAT32_MAX)
            out[:, self.start] = v
            _reject(code, bad, f"not_a_number:{f.name}", reasons)
            _reject(code, huge, f"non_finite:{f.name}", reasons)
            if f.missing == "reject":
                _reject(code, gap, f"missing:{f.name}", reasons)
        elif f.kind == "id":
            from pipeline.table import ids  # it reads values with text(), from here

            keys = ids.id_keys(values)
            gap = keys == ids.GAP
            out[:, self.start : self.start + ids.LANES] = ids.to_lanes(keys)
            if f.missing == "reject":
                _reject(code, gap, f"missing:{f.name}", reasons)
        elif f.kind == "boolean":
            v = np.array([_boolean(x) for x in values], np.float64)
            gap = np.isnan(v)
            bad = v < 0
            v[gap] = f.fill
            out[:, self.start] = np.where(bad, 0.0, v)
            _reject(code, bad, f"not_a_boolean:{f.name}", reasons)
            if f.missing == "reject":
                _reject(code, gap, f"missing:{f.name}", reasons)
        else:
            index = self.indices(values)
            gap = index < 0
            index[gap] = 0
            if f.encoding == "index":
                out[:, self.start] = index
            else:
                out[np.arange(len(index)), self.start + index] = 1.0
            if f.missing == "reject":
                _reject(code, gap, f"missing:{f.name}", reasons)

    def indices(self, values: Sequence[Any]) -> np.ndarray:
        """Slot of each value: 1.. known, 0 unknown, -1 a gap."""
        f = self.f
        if f.vocabulary:
            found = self.lookup.get
            index = np.array([found(v, 0) if v.__class__ is str else -2 for v in values], np.int64)
            for i in np.flatnonzero(
                index <= 0
            ).tolist():  # not a known string as is: normalize, look again
                t = text(values[i])
                index[i] = -1 if t is None else found(t, 0)
            return index
        out = np.empty(len(values), np.int64)
        for i, v in enumerate(values):
            t = text(v)
            out[i] = -1 if t is None else zlib.crc32(t.encode()) % f.hash_buckets + 1
        return out


def _boolean(value: Any) -> float:
    """1.0 or 0.0; NaN for a gap; -1.0 for anything else."""
    key = value.strip().lower() if isinstance(value, str) else value
    if key in _TRUE:
        return 1.0
    if key in _FALSE:
        return 0.0
    if (
        value is None
        or (isinstance(value, str) and value.strip() in GAP_TOKENS)
        or (isinstance(value, float) and math.isnan(value))
    ):
        return float("nan")
    return -1.0


def _reject(code: np.ndarray, mask: np.ndarray, reason: str, reasons: Reasons) -> None:
    hit = mask & (code < 0)
    if hit.any():
        code[hit] = reasons.code(reason)


class Encoder:
    """A schema's transform, its lookups built once: :meth:`encode` per block of records."""

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        self.columns, start = [], 0
        for f in schema.features:
            self.columns.append(_Column(f, start))
            start += f.width
        label = schema.label
        self._classes = (
            {c: i for i, c in enumerate(label.classes)}
            if label is not None and label.classes
            else None
        )

    def encode(
        self, columns: Mapping[str, Sequence[Any]], n: int, reasons: Reasons
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(x, y, code)`` of ``n`` records given as columns (a missing column is all gaps):
        x ``(n, width)`` float32, y int32 class indices or float32 targets (zeros without a
        label), and each record's reject code (-1: accepted)."""
        x = np.zeros((n, self.schema.width), np.float64)
        code = np.full(n, -1, np.int32)
        gaps = [None] * n
        for col in self.columns:
            col.encode(columns.get(col.f.name, gaps), x, code, reasons)
        y = self._labels(columns, n, code, reasons)
        with np.errstate(
            over="ignore"
        ):  # a rejected record's value may be beyond float32; it never trains
            return x.astype(np.float32), y, code

    def _labels(
        self, columns: Mapping[str, Sequence[Any]], n: int, code: np.ndarray, reasons: Reasons
    ) -> np.ndarray:
        label = self.schema.label
        if label is None:
            return np.zeros(n, np.int32)
        values = columns.get(label.name, [None] * n)
        if self._classes is None:
            v, bad = numbers(values)
            _reject(code, bad, f"not_a_number:{label.name}", reasons)
            _reject(code, np.isnan(v) & ~bad, f"missing:{label.name}", reasons)
            _reject(code, np.isinf(v), f"non_finite:{label.name}", reasons)
            return np.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0).astype(np.float32)
        found = self._classes.get
        if isinstance(values, np.ndarray):  # numbers (Arrow's column): each distinct one's text
            distinct, where = np.unique(values, return_inverse=True)
            at = [found(t, -1) if (t := text(float(v))) is not None else -2 for v in distinct]
            y = np.array(at, np.int64)[where.reshape(-1)] if at else np.zeros(0, np.int64)
        else:
            y = np.array([found(v, -1) if v.__class__ is str else -2 for v in values], np.int64)
            for i in np.flatnonzero(y < 0).tolist():
                t = text(values[i])
                y[i] = -2 if t is None else found(t, -1)
        _reject(code, y == -2, f"missing:{label.name}", reasons)
        _reject(code, y == -1, f"unknown_class:{label.name}", reasons)
        return np.where(y < 0, 0, y).astype(np.int32)
