"""A schema read off a sample of records, for the user to read and edit (as TensorFlow
Data Validation infers one): each column's kind, its vocabulary or scale, the label's
classes or a numeric target.

Example:
    >>> s = infer({"w": [1.0, 3.0, None], "c": ["a", "b", "a"], "ok": ["yes", "no", ""], "y": ["p", "q", "p"]},
    ...           label="y")
    >>> [(f.name, f.kind) for f in s.features], s.label.classes
    ([('w', 'numeric'), ('c', 'categorical'), ('ok', 'boolean')], ('p', 'q'))
    >>> s.features[0].scale, s.features[0].fill
    ((2.0, 1.0), 2.0)
    >>> infer({"x": [1, 2, 3, 4], "t": [0.5, 1.25, 2.0, 3.5]}, label="t").regression
    True
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.table.schema import Feature, Label, TableSchema
from pipeline.table.transform import _FALSE, _TRUE, numbers, text

#: A categorical column with more distinct values than this is hashed instead of listed.
MAX_VOCABULARY = 50
HASH_BUCKETS = 64
#: An integer label with at most this many distinct values is a class; beyond, a target.
MAX_CLASSES = 20
#: A column is numeric when at most this share of its values are not numbers (those are
#: then data errors, rejected by name, rather than making the column categorical).
MAX_NOT_NUMBERS = 0.02


def infer(columns: Mapping[str, Sequence[Any]], *, label: str | None, regression: bool | None = None,
          ignore: Sequence[str] = (), format: str = "json") -> TableSchema:
    """A schema for ``columns`` (name -> sample values), ``label`` the target column.

    Args:
        columns: a sample of the records, by column.
        label: the target's column (None: unlabelled instances).
        regression: force a numeric target (True) or classes (False); None: decide from
            the values.
        ignore: columns that are not features (ids, free text).
        format: the records' format on the topic.
    """
    if label is not None and label not in columns:
        raise ConfigError(f"Expected the label column {label!r} among the columns. Received: {list(columns)[:20]}. "
                          "Pass --label with one of them.")
    unknown = [c for c in ignore if c not in columns]
    if unknown:
        raise ConfigError(f"Expected --ignore to name columns. Received: {unknown}; the columns are {list(columns)[:20]}.")
    features = tuple(_feature(name, values) for name, values in columns.items() if name != label and name not in ignore)
    if not features:
        raise ConfigError(f"Expected at least one feature column besides the label {label!r}. Received: {list(columns)}.")
    target = _label(label, columns[label], regression) if label is not None else None
    schema = TableSchema(features, target, format=format)
    return schema.with_format("csv") if format == "csv" else schema


def _feature(name: str, values: Sequence[Any]) -> Feature:
    present = [v for v in values if text(v) is not None]
    if present and all(_is_boolean(v) for v in present):
        return Feature(name, "boolean", fill=0.0)
    v, bad = numbers(values)
    if bad.sum() <= MAX_NOT_NUMBERS * max(1, len(present)) and np.isfinite(v).any():
        finite = v[np.isfinite(v)]
        mean, std = float(finite.mean()), float(finite.std())
        return Feature(name, "numeric", fill=round(mean, 6), scale=(round(mean, 6), round(1.0 / std, 6) if std > 0 else 1.0))
    counts = Counter(t for t in (text(x) for x in values) if t is not None)
    if len(counts) <= MAX_VOCABULARY:
        return Feature(name, "categorical", vocabulary=tuple(sorted(counts)))
    return Feature(name, "categorical", hash_buckets=HASH_BUCKETS)


def _is_boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    return isinstance(value, str) and value.strip().lower() in (set(_TRUE) | set(_FALSE)) - {"1", "0"}


def _label(name: str, values: Sequence[Any], regression: bool | None) -> Label:
    v, bad = numbers(values)
    finite = v[np.isfinite(v)]
    numeric = not bad.any() and finite.size > 0
    if regression is None:
        regression = numeric and not (np.all(finite == np.round(finite)) and len(np.unique(finite)) <= MAX_CLASSES)
    if regression:
        if not numeric:
            raise ConfigError(f"Expected numbers in the label column {name!r} for a numeric target. "
                              f"Received: {[x for x, b in zip(values, bad, strict=True) if b][:3]}.")
        spread = float(finite.std())
        return Label(name, scale=(round(float(finite.mean()), 6), round(spread, 6) if spread > 0 else 1.0))
    classes = sorted({t for t in (text(x) for x in values) if t is not None},
                     key=lambda c: (float(c), c) if numeric else (0.0, c))
    if len(classes) < 2:
        raise ConfigError(f"Expected at least two classes in the label column {name!r}. Received: {classes}.")
    return Label(name, tuple(classes))
