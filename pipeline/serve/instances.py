"""A prediction request's body, as TensorFlow Serving's REST API takes it, checked and
turned into the features a model trains on (numpy only).

Two shapes are accepted, as in TensorFlow Serving: the row format
``{"instances": [instance, ...]}`` and the columnar ``{"inputs": [instance, ...]}``
(or either with one named input, ``{"inputs": {"x": [...]}}``). An instance is the
record's features as the producer sends them: for MNIST, 784 pixel values in
[0, 255] (flat, 28 x 28, or 28 x 28 x 1); for HIGGS, 28 numbers; for a user's table,
an object of raw fields (strings and gaps included), transformed by the run's
schema exactly as training was. Every way a body can be wrong is a :class:`BadRequest`
that says what was expected and what arrived.

Example:
    >>> from pipeline import codec
    >>> x, columnar = parse(
    ...     b'{"instances": [[0.5, 1.5], [2, 3]]}', codec.generic(2, 2), max_instances=8
    ... )
    >>> x.tolist(), columnar
    ([[0.5, 1.5], [2.0, 3.0]], False)
    >>> parse(
    ...     b'{"instances": [[1, 2, 3]]}', codec.generic(2, 2), max_instances=8
    ... )  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    pipeline.serve.instances.BadRequest: Expected each instance to hold 2 numbers (shape [2]);
    instance 0 holds 3.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NamedTuple

import numpy as np

from pipeline.codec import Schema, holds_bool
from pipeline.errors import StreamtrainError


class BadRequest(StreamtrainError):
    """A request the server refuses for its content; ``status`` is the HTTP status to answer
    with and ``reason`` the label it is counted under."""

    def __init__(self, message: str, *, status: int = 400, reason: str = "bad_instances") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


def _shape_text(schema: Schema) -> str:
    return "[" + ", ".join(str(d) for d in schema.input_shape) + "]"


def _rows(body: Any) -> tuple[Any, bool]:
    if not isinstance(body, dict):
        raise BadRequest(
            'Expected a JSON object with "instances" or "inputs". Received: a JSON '
            f"{type(body).__name__}.",
            reason="bad_json",
        )
    keys = [k for k in ("instances", "inputs") if k in body]
    if len(keys) != 1:
        raise BadRequest(
            'Expected exactly one of "instances" or "inputs" in the request. '
            f"Received keys: {sorted(body)[:8]}.",
            reason="bad_json",
        )
    rows = body[keys[0]]
    if isinstance(rows, dict):  # one named input (this model has one)
        if len(rows) != 1:
            raise BadRequest(
                f"Expected one named input (the model has one). Received {len(rows)}: "
                f"{sorted(rows)[:8]}.",
                reason="bad_json",
            )
        rows = next(iter(rows.values()))
    if not isinstance(rows, list):
        raise BadRequest(
            f'Expected "{keys[0]}" to be a list of instances. Received: a JSON '
            f"{type(rows).__name__}.",
            reason="bad_json",
        )
    return rows, keys[0] == "inputs"


def _instance(row: Any, index: int, schema: Schema) -> np.ndarray:
    if isinstance(row, dict) and len(row) == 1:
        row = next(iter(row.values()))
    try:
        # No dtype given: numpy would turn the string "12" into 12.0.
        x = np.asarray(row)
        if x.dtype.kind not in "iufb":
            raise TypeError(x.dtype)
        x = x.astype(np.float64)
    except (TypeError, ValueError, OverflowError, RecursionError):
        raise BadRequest(
            f"Expected instance {index} to hold only numbers (shape {_shape_text(schema)}); "
            "it holds something else (a string, null, or lists of unequal length).",
            reason="not_numeric",
        ) from None
    if holds_bool(row):
        raise BadRequest(
            f"Expected instance {index} to hold only numbers; it holds true or false.",
            reason="not_numeric",
        )
    if x.size != schema.n_features:
        raise BadRequest(
            f"Expected each instance to hold {schema.n_features} numbers (shape "
            f"{_shape_text(schema)}); instance {index} holds {x.size}.",
            reason="wrong_shape",
        )
    if not np.isfinite(x).all():
        raise BadRequest(
            f"Expected finite numbers; instance {index} holds NaN or infinity.",
            reason="not_numeric",
        )
    if schema.dtype == "uint8" and (x.min() < 0 or x.max() > 255):
        raise BadRequest(
            f"Expected pixel values in [0, 255] (as the producer sends them); instance {index} "
            f"holds values in [{x.min():g}, {x.max():g}].",
            reason="out_of_range",
        )
    return x.reshape(-1)


#: Digits an integer may have: no feature needs more, and a 310-digit one overflows a float.
MAX_DIGITS = 40
#: The longest string a table's instance may hold (a category or a name), and where the
#: instances are numbers, the longest key ("instances", an input's name).
MAX_STRING, MAX_KEY = 4096, 256
#: A JSON string, escapes included: scanned left to right, a closing quote never opens one.
_STRING = re.compile(
    rb'"[^"\\]*(?:\\.[^"\\]*)*"'
)  # the unrolled loop: runs of plain bytes at C speed


def _longest_string_over(raw: bytes, limit: int) -> int | None:
    """The length of the body's first JSON string longer than ``limit`` bytes, if any.

    >>> (
    ...     _longest_string_over(b'{"instances": [[1, 2, 3]]}', 16),
    ...     _longest_string_over(b'["abc", "' + b"x" * 20 + b'"]', 16),
    ... )
    (None, 20)
    """
    for m in _STRING.finditer(raw):
        if m.end() - m.start() - 2 > limit:
            return m.end() - m.start() - 2
    return None


def _number(text: str) -> float:
    """A JSON integer, as the float it becomes anyway; one too long is refused.

    >>> _number("255"), _number("-3")
    (255.0, -3.0)
    """
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise BadRequest(
            f"Expected numbers of at most {MAX_DIGITS} digits. Received an integer of "
            f"{len(text.lstrip('-'))} digits.",
            reason="number_too_large",
        )
    return float(text)


class Request(NamedTuple):
    """A checked request: its instances as an ``(n, n_features)`` float64 array in the
    producer's units, whether it was columnar (answer ``"outputs"``, not ``"predictions"``),
    and for a table, the features each instance's gaps had filled (None: not a table)."""

    x: np.ndarray
    columnar: bool
    filled: list[list[str]] | None = None


def parse(raw: bytes, schema: Schema, *, max_instances: int) -> tuple[np.ndarray, bool]:
    """The body's instances and whether the request was columnar (:func:`parse_request`)."""
    request = parse_request(raw, schema, max_instances=max_instances)
    return request.x, request.columnar


def parse_request(raw: bytes, schema: Schema, *, max_instances: int) -> Request:
    """The body checked and turned into a :class:`Request`; a :class:`BadRequest` otherwise."""
    # What parsing costs is ~30 bytes of Python objects per number: count the numbers
    # (separators, one pass in C) before making them, against what the request may hold.
    most = max_instances * (schema.n_features + 1) + 16
    if raw.count(b",") > most:
        raise BadRequest(
            f"Expected at most {max_instances} instances of {schema.n_features} numbers. Received "
            f"a body of more than {most:,} values; split the request.",
            status=413,
            reason="too_many_values",
        )
    # A string costs up to 4 bytes a character as Python's, and again as numpy's: one long
    # enough to matter is no field of an instance (a name, a category), so it is refused
    # before the decoder builds it.
    longest = MAX_STRING if schema.table is not None else MAX_KEY
    if (found := _longest_string_over(raw, longest)) is not None:
        raise BadRequest(
            f"Expected strings of at most {longest:,} bytes in an instance. Received one of "
            f"{found:,} bytes.",
            status=413,
            reason="string_too_long",
        )
    try:
        body = json.loads(raw, parse_constant=lambda c: math.nan, parse_int=_number)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequest(
            f"Expected a JSON body. Received bytes that are not JSON ({e}).", reason="bad_json"
        ) from None
    except RecursionError:
        raise BadRequest(
            "Expected JSON nested a few levels deep (instances of numbers). Received JSON nested "
            "deeper than the decoder goes.",
            reason="too_deep",
        ) from None
    rows, columnar = _rows(body)
    if not rows:
        raise BadRequest("Expected at least one instance. Received none.", reason="no_instances")
    if len(rows) > max_instances:
        raise BadRequest(
            f"Expected at most {max_instances} instances per request. Received {len(rows)}; "
            "split the request.",
            status=413,
            reason="too_many_instances",
        )
    if (
        schema.table is not None
    ):  # raw fields, checked by name and kind, through the run's transform
        from pipeline.serve import table_instances

        x, filled = table_instances.encode(rows, schema.table)
        return Request(x, columnar, filled)
    fast = _all_at_once(rows, schema) if b"true" not in raw and b"false" not in raw else None
    if fast is not None:
        return Request(fast, columnar)
    # Something is wrong, or unusual (instances as objects): one at a time, to name it.
    return Request(np.stack([_instance(row, i, schema) for i, row in enumerate(rows)]), columnar)


def _all_at_once(rows: list[Any], schema: Schema) -> np.ndarray | None:
    """The common case in one conversion (a third of the time of one per instance), or
    None if any check fails."""
    try:
        x = np.asarray(rows)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return None
    if x.dtype.kind not in "iuf":  # strings ("12"), objects, booleans: one at a time, to name them
        return None
    x = x.astype(np.float64, copy=False)
    if x.ndim < 2 or x[0].size != schema.n_features or not np.isfinite(x).all():
        return None
    if schema.dtype == "uint8" and (x.min() < 0 or x.max() > 255):
        return None
    return x.reshape(len(rows), -1)
