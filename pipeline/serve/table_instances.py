"""A table's prediction instances: objects of raw fields, checked against the run's schema
before its transform, as TensorFlow Serving refuses inputs a model does not have.

An unknown field (a misspelt name, whose feature would silently become a gap), an
instance with none of the schema's features, and a category that is no text (the number
5, ``true``, NaN) are refused, naming the field and listing every expected one. A gap
that the schema's rule fills (a missing field, a null, ``"NA"``) is allowed, and named in
the answer's ``filled``, so a caller sees what the prediction did not use.

Example:
    >>> from pipeline.table import TableSchema
    >>> s = TableSchema.from_dict({"features": [{"name": "size"},
    ...     {"name": "color", "kind": "categorical", "vocabulary": ["red", "blue"]}]})
    >>> x, filled = encode([{"size": 2.0, "color": "red"}, {"color": None}], s)
    >>> x.shape, filled
    ((2, 4), [[], ['size', 'color']])
    >>> encode([{"size": 1, "colour": "red"}], s)  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    pipeline.serve.instances.BadRequest: Expected only the schema's fields ['size', 'color'].
    Received unknown ones in instance 0: ['colour'].
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pipeline.serve.instances import BadRequest
from pipeline.table import encode_rows
from pipeline.table.schema import Feature, TableSchema
from pipeline.table.transform import text


def _is_gap(value: Any) -> bool:
    return (
        value is None
        or (isinstance(value, float) and math.isnan(value))
        or (isinstance(value, str) and text(value) is None)
    )


def _check_category(f: Feature, value: Any, index: int) -> None:
    """A category arrives as text; a number is one only where its text is a known value
    (a vocabulary of codes such as "5"); booleans and NaN never are."""
    if isinstance(value, str) or value is None:
        return
    known = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and not (isinstance(value, float) and math.isnan(value))
        and text(value) in f.vocabulary
    )
    if not known:
        shown = (
            "NaN"
            if isinstance(value, float) and math.isnan(value)
            else str(value).lower()
            if isinstance(value, bool)
            else repr(value)
        )
        raise BadRequest(
            f"Expected text for the category {f.name!r} (one of {list(f.vocabulary)[:20]}, or "
            f"null for a gap) in instance {index}. Received: {shown}.",
            reason="bad_field",
        )


def _check_number(f: Feature, value: Any, index: int) -> None:
    if isinstance(value, (bool, dict, list)):
        raise BadRequest(
            f"Expected a number for {f.name!r} in instance {index}. Received: "
            f"{str(value).lower()}.",
            reason="bad_field",
        )


def encode(rows: list[Any], schema: TableSchema) -> tuple[np.ndarray, list[list[str]]]:
    """The model's input for raw instances and, for each, the features a gap filled."""
    features = schema.features
    names = [f.name for f in features]
    known = set(names)
    filled: list[list[str]] = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise BadRequest(
                f"Expected each instance to be an object of the fields {names}; instance {i} is a "
                f"JSON {type(row).__name__}.",
                reason="wrong_shape",
            )
        unknown = [k for k in row if k not in known]
        if unknown:
            raise BadRequest(
                f"Expected only the schema's fields {names}. Received unknown ones in instance "
                f"{i}: {unknown[:20]}.",
                reason="unknown_field",
            )
        if not row:
            raise BadRequest(
                f"Expected instance {i} to hold at least one of the schema's fields {names}. "
                "Received none.",
                reason="no_features",
            )
        gaps = []
        for f in features:
            value = row.get(f.name)
            if f.kind == "categorical":
                _check_category(f, value, i)
            elif f.kind == "numeric":
                _check_number(f, value, i)
            if _is_gap(value):
                gaps.append(f.name)
        filled.append(gaps)
    # NaN is a gap to the transform as null is (the JSON parser reads the NaN constant).
    clean = [
        {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
        for row in rows
    ]
    try:
        return encode_rows(clean, schema).astype(np.float64), filled
    except (
        ValueError
    ) as e:  # names the instance and the field: "instance 2: not_a_number:bill_length_mm"
        raise BadRequest(
            f"Expected instances the run's schema can encode. Received {e}.", reason="bad_field"
        ) from None


def metadata(schema: TableSchema) -> dict[str, Any]:
    """What a table's model takes and gives, for ``GET .../metadata``.

    >>> from pipeline.table import TableSchema
    >>> m = metadata(
    ...     TableSchema.from_dict(
    ...         {"features": [{"name": "x"}], "label": {"name": "price", "kind": "numeric"}}
    ...     )
    ... )
    >>> m["inputs"]["fields"], m["outputs"]["meaning"]  # doctest: +NORMALIZE_WHITESPACE
    ([{'name': 'x', 'kind': 'numeric', 'missing': 'fill'}], "the predicted value of 'price' (a
    numeric target: regression)")
    """
    fields = []
    for f in schema.features:
        d: dict[str, Any] = {"name": f.name, "kind": f.kind, "missing": f.missing}
        if f.vocabulary:
            d["values"] = list(f.vocabulary)
        fields.append(d)
    inputs = {
        "fields": fields,
        "instance": "an object of these fields, raw (strings and gaps as in the data)",
    }
    label = schema.label
    if label is not None and label.regression:
        outputs: dict[str, Any] = {
            "shape": [-1, 1],
            "meaning": f"the predicted value of {label.name!r} (a numeric target: regression)",
        }
    else:
        classes = list(label.classes) if label is not None else []
        outputs = {
            "shape": [-1, len(classes)],
            "meaning": "class probabilities",
            "classes": classes,
        }
        if label is not None:
            outputs["label"] = label.name
    return {"inputs": inputs, "outputs": outputs}
