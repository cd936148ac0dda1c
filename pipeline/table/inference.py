"""A schema read off a sample of records, for the user to read and edit (as TensorFlow
Data Validation infers one): each column's kind, its vocabulary or scale, the label's
classes or a numeric target.

Example:
    >>> s = infer(
    ...     {
    ...         "w": [1.0, 3.0, None],
    ...         "c": ["a", "b", "a"],
    ...         "ok": ["yes", "no", ""],
    ...         "y": ["p", "q", "p"],
    ...     },
    ...     label="y",
    ... )
    >>> [(f.name, f.kind) for f in s.features], s.label.classes
    ([('w', 'numeric'), ('c', 'categorical'), ('ok', 'boolean')], ('p', 'q'))
    >>> s.features[0].scale, s.features[0].fill
    ((2.0, 1.0), 2.0)
    >>> infer({"x": [1, 2, 3, 4], "t": [0.5, 1.25, 2.0, 3.5]}, label="t").regression
    True

A column of numbers with words among them is categorical, and :func:`mixed_columns` says
so; ``numeric=`` reads it as numbers (the words then rejected by name):

    >>> cols = {"w": ["1", "2", "abc", "3"], "y": ["p", "q", "p", "q"]}
    >>> [(n.name, n.share, n.examples) for n in mixed_columns(cols, infer(cols, label="y"))]
    [('w', 0.25, ('abc',))]
    >>> infer(cols, label="y", numeric=["w"]).features[0].kind
    'numeric'
"""

from __future__ import annotations

import dataclasses
import re
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
#: A column of at least this many distinct values, of which the sample's second half brings
#: at least this share new, is a column of IDs (``id``: a row per ID on the parameter server).
MIN_IDS, NEW_IDS = 200, 0.1
#: The embedding size an inferred ID column is given (the schema file is the user's to edit).
ID_DIM = 16
#: An integer label with at most this many distinct values is a class; beyond, a target.
MAX_CLASSES = 20
#: A column is numeric when at most this share of its values are not numbers (those are
#: then data errors, rejected by name, rather than making the column categorical).
MAX_NOT_NUMBERS = 0.02
#: A categorical column whose values are at least this share numbers is worth a word: most
#: likely numbers with data errors among them.
MOSTLY_NUMBERS = 0.5


def infer(
    columns: Mapping[str, Sequence[Any]],
    *,
    label: str | None,
    regression: bool | None = None,
    ignore: Sequence[str] = (),
    format: str = "json",
    numeric: Sequence[str] = (),
) -> TableSchema:
    """A schema for ``columns`` (name -> sample values), ``label`` the target column.

    Args:
        columns: a sample of the records, by column.
        label: the target's column (None: unlabelled instances).
        regression: force a numeric target (True) or classes (False); None: decide from
            the values.
        ignore: columns that are not features (ids, free text).
        format: the records' format on the topic.
        numeric: columns read as numbers whatever else they hold (what is not a number
            is then a reject, ``not_a_number:COLUMN``).
    """
    if label is not None and label not in columns:
        raise ConfigError(
            f"Expected the label column {label!r} among the columns. Received: "
            f"{list(columns)[:20]}. Pass --label with one of them."
        )
    unknown = [c for c in ignore if c not in columns]
    if unknown:
        raise ConfigError(
            f"Expected --ignore to name columns. Received: {unknown}; the columns are "
            f"{list(columns)[:20]}."
        )
    unknown = [c for c in numeric if c not in columns or c == label]
    if unknown:
        raise ConfigError(
            f"Expected --numeric to name feature columns. Received: {unknown}; the columns are "
            f"{list(columns)[:20]}."
        )
    features = tuple(
        _feature(name, values, numeric=name in numeric)
        for name, values in columns.items()
        if name != label and name not in ignore
    )
    if not features:
        raise ConfigError(
            f"Expected at least one feature column besides the label {label!r}. Received: "
            f"{list(columns)}."
        )
    target = _label(label, columns[label], regression) if label is not None else None
    schema = TableSchema(features, target)
    return schema.with_format(format) if format != "json" else schema


def _feature(name: str, values: Sequence[Any], *, numeric: bool = False) -> Feature:
    nested = next((v for v in values if isinstance(v, (list, dict, tuple))), None)
    if nested is not None:
        raise ConfigError(
            f"Expected flat values (numbers, strings, booleans) in column {name!r}. Received a "
            f"{type(nested).__name__}: {str(nested)[:60]}. Flatten it into columns of its own, or "
            f"leave it out with --ignore {name}."
        )
    present = [v for v in values if text(v) is not None]
    if present and not numeric and all(_is_boolean(v) for v in present):
        return Feature(name, "boolean", fill=0.0)
    if not numeric and _growing_ids(name, present):
        return Feature(name, "id", dim=ID_DIM)
    v, bad = numbers(values)
    if (numeric or bad.sum() <= MAX_NOT_NUMBERS * max(1, len(present))) and np.isfinite(v).any():
        finite = v[np.isfinite(v)]
        mean, std = float(finite.mean()), float(finite.std())
        return Feature(
            name,
            "numeric",
            fill=round(mean, 6),
            scale=(round(mean, 6), round(1.0 / std, 6) if std > 0 else 1.0),
        )
    counts = Counter(t for t in (text(x) for x in values) if t is not None)
    if len(counts) <= MAX_VOCABULARY:
        return Feature(name, "categorical", vocabulary=tuple(sorted(counts)))
    return Feature(name, "categorical", hash_buckets=HASH_BUCKETS)


def _growing_ids(name: str, present: Sequence[Any]) -> bool:
    """Whether a column reads as IDs (users, items): many distinct values that keep coming
    (the sample's second half brings at least :data:`NEW_IDS` of its values new), text, or
    whole numbers in a column named as an ID (``user_id``, ``itemId``).

    >>> ids = [f"u{i}" for i in range(400)]
    >>> _growing_ids("user", ids), _growing_ids("color", ["red", "blue"] * 200)
    (True, False)
    >>> _growing_ids("item_id", list(range(400))), _growing_ids("price", list(range(400)))
    (True, False)
    >>> _growing_ids("x0", [f"{0.001 * i:.3f}" for i in range(400)])  # a CSV's decimals
    False
    """
    texts = [t for t in (text(v) for v in present) if t is not None]
    distinct = set(texts)
    if len(distinct) < MIN_IDS:
        return False
    half = len(texts) // 2
    later = set(texts[half:])
    if len(later - set(texts[:half])) < NEW_IDS * len(later):
        return False
    _, bad = numbers(texts)
    if bad.sum() > MAX_NOT_NUMBERS * len(texts):  # text: names, codes, hashes
        return True
    # Numbers (a CSV's are text): IDs only if every one is whole and the column is named as one.
    whole = all(t.lstrip("-").isdigit() for t in distinct)
    return whole and bool(re.search(r"(^|_)id$|[a-z]Id$", name, re.IGNORECASE))


@dataclasses.dataclass(frozen=True)
class MixedColumn:
    """A column taken as categorical although most of its values are numbers.

    Attributes:
        name: the column.
        share: the share of its present values that are not numbers.
        examples: a few of those values, most common first.
    """

    name: str
    share: float
    examples: tuple[str, ...]

    def line(self) -> str:
        """What ``schema infer`` says of it."""
        shown = ", ".join(repr(e) for e in self.examples)
        return (
            f"column {self.name!r} taken as categorical: {self.share:.0%} of its values are not "
            f"numbers (e.g. {shown}); to read it as numeric (those values then rejected, counted "
            f"by name), add --numeric {self.name}"
        )


def mixed_columns(columns: Mapping[str, Sequence[Any]], schema: TableSchema) -> list[MixedColumn]:
    """The categorical features of ``schema`` whose sample in ``columns`` is mostly numbers."""
    out = []
    for f in schema.features:
        if f.kind != "categorical" or f.name not in columns:
            continue
        values = columns[f.name]
        v, bad = numbers(values)
        present = int((~np.isnan(v)).sum() + bad.sum())
        if not bad.any() or present == 0 or (present - bad.sum()) < MOSTLY_NUMBERS * present:
            continue
        words = Counter(str(x).strip() for x, b in zip(values, bad, strict=True) if b)
        out.append(
            MixedColumn(
                f.name,
                round(float(bad.sum()) / present, 4),
                tuple(w for w, _ in words.most_common(3)),
            )
        )
    return out


def _is_boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    return isinstance(value, str) and value.strip().lower() in (set(_TRUE) | set(_FALSE)) - {
        "1",
        "0",
    }


def _label(name: str, values: Sequence[Any], regression: bool | None) -> Label:
    v, bad = numbers(values)
    finite = v[np.isfinite(v)]
    numeric = not bad.any() and finite.size > 0
    if regression is None:
        regression = numeric and not (
            np.all(finite == np.round(finite)) and len(np.unique(finite)) <= MAX_CLASSES
        )
    if regression:
        if not numeric:
            raise ConfigError(
                f"Expected numbers in the label column {name!r} for a numeric target. "
                f"Received: {[x for x, b in zip(values, bad, strict=True) if b][:3]}."
            )
        spread = float(finite.std())
        return Label(
            name, scale=(round(float(finite.mean()), 6), round(spread, 6) if spread > 0 else 1.0)
        )
    classes = sorted(
        {t for t in (text(x) for x in values) if t is not None},
        key=lambda c: (float(c), c) if numeric else (0.0, c),
    )
    if len(classes) < 2:
        raise ConfigError(
            f"Expected at least two classes in the label column {name!r}. Received: {classes}."
        )
    return Label(name, tuple(classes))
