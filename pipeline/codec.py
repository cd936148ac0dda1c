"""The record wire format, shared by producers and the pipeline (numpy only).

A record is one Kafka value: an 8-byte little-endian header, then the features.

======  ====  =====================================================
offset  type  field
======  ====  =====================================================
0       u8    format version (``VERSION``, now 1)
1       u8    schema id (1 mnist, 2 fashion-mnist, 3 higgs, 4 generic)
2       u16   number of features
4       i32   label (a class index)
8       ...   features: uint8 pixels or float32 values
======  ====  =====================================================

The Kafka key is the record id (8 bytes, big-endian unsigned; see
:mod:`pipeline.record_key`) and the Kafka timestamp is the event time. The header is 8
bytes so that float32 features start aligned. Decoding is vectorized: one call turns a
block of values into numpy arrays, and every record it cannot train on becomes a reject
with a named reason instead of an exception.

Example:
    >>> import numpy as np
    >>> values = encode(np.zeros((2, 784), np.uint8), np.array([3, 7]), MNIST)
    >>> len(values[0])
    792
    >>> batch = decode(values + [b"junk"], MNIST)
    >>> batch.y.tolist(), batch.x.shape, batch.reject_counts()
    ([3, 7], (2, 784), {'wrong_length': 1})
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from pipeline.errors import ConfigError

VERSION = 1
HEADER_BYTES = 8

#: Reject reasons, in the order they are checked; the index is the stored code.
REASONS = (
    "wrong_length",
    "unknown_version",
    "wrong_schema",
    "label_out_of_range",
    "non_finite",
    "not_an_instance",
)
_WRONG_LENGTH, _UNKNOWN_VERSION, _WRONG_SCHEMA, _LABEL_RANGE, _NON_FINITE, _NOT_AN_INSTANCE = range(
    len(REASONS)
)


@dataclasses.dataclass(frozen=True)
class Schema:
    """The layout of one dataset's records.

    Args:
        name: dataset name, as used on the command line.
        schema_id: the byte stored at offset 1.
        dtype: feature dtype on the wire, ``"uint8"`` or ``"float32"``.
        n_features: features per record.
        num_classes: labels must lie in ``[0, num_classes)``.
        input_shape: the shape a model sees, e.g. ``(28, 28, 1)``.
        encoding: ``"wire"`` (the layout above) or ``"json"``: each value one JSON
            instance of the features, unlabelled (what a prediction stream may carry; see
            :func:`json_instances`); for a table, its records' format.
        table: a user's table (a :class:`pipeline.table.TableSchema`): its records are JSON,
            CSV or Avro, decoded and transformed by it (see :func:`table`).
        holdout: the share of records, by key, never trained (they score the model;
            see :func:`pipeline.record_key.held_out`).
    """

    name: str
    schema_id: int
    dtype: str
    n_features: int
    num_classes: int
    input_shape: tuple[int, ...]
    encoding: str = "wire"
    table: Any = None
    holdout: float = 0.0

    @property
    def regression(self) -> bool:
        """Whether the label is a numeric target rather than a class."""
        return bool(self.table is not None and self.table.regression)

    @property
    def record_bytes(self) -> int:
        """Length of one encoded record."""
        return HEADER_BYTES + self.n_features * np.dtype(self.dtype).itemsize

    def to_model_input(self, x: np.ndarray) -> np.ndarray:
        """Features as the float32 tensor a model trains on (pixels scaled to [0, 1]).

        >>> MNIST.to_model_input(np.full((1, 784), 255, np.uint8)).shape
        (1, 28, 28, 1)
        """
        out = x.astype(np.float32, copy=False)
        if self.table is not None and self.table.ids:  # keys: their rows are looked up later
            return out
        if self.dtype == "uint8":
            out = out * np.float32(1.0 / 255.0)
        return out.reshape((len(x), *self.input_shape))


MNIST = Schema("mnist", 1, "uint8", 784, 10, (28, 28, 1))
FASHION_MNIST = Schema("fashion-mnist", 2, "uint8", 784, 10, (28, 28, 1))
HIGGS = Schema("higgs", 3, "float32", 28, 2, (28,))
_GENERIC_ID = 4
_TABLE_ID = 5
SCHEMAS = {s.name: s for s in (MNIST, FASHION_MNIST, HIGGS)}


def generic(n_features: int, num_classes: int) -> Schema:
    """Schema for N float32 features and a class label (CSV and NPZ data).

    >>> generic(3, 2).record_bytes
    20
    """
    if not 0 < n_features < 2**16:
        raise ConfigError(
            "Expected between 1 and 65535 features for a generic record. "
            f"Received: n_features={n_features}"
        )
    if num_classes < 1:
        raise ConfigError(f"Expected num_classes >= 1. Received: num_classes={num_classes}")
    return Schema("generic", _GENERIC_ID, "float32", n_features, num_classes, (n_features,))


def table(name: str, schema: Any) -> Schema:
    """The layout of a user's table: its encoded width, its classes (0 for a numeric target),
    its records decoded by ``schema`` (a :class:`pipeline.table.TableSchema`)."""
    return Schema(
        name,
        _TABLE_ID,
        "float32",
        schema.width,
        schema.num_classes,
        (schema.model_width,),
        encoding=schema.format,
        table=schema,
    )


def encode_block(features: np.ndarray, labels: np.ndarray, schema: Schema) -> np.ndarray:
    """Encode N records into an ``(N, record_bytes)`` uint8 array, one record a row.

    Features are cast to the schema's dtype; callers validate ranges before.
    """
    n = len(labels)
    flat = np.asarray(features).reshape(n, schema.n_features if n == 0 else -1)
    if flat.shape[1] != schema.n_features:
        raise ConfigError(
            f"Expected {schema.n_features} features per {schema.name} record. "
            f"Received: {flat.shape[1]}"
        )
    block = np.empty((n, schema.record_bytes), np.uint8)
    block[:, 0] = VERSION
    block[:, 1] = schema.schema_id
    block[:, 2:4] = np.frombuffer(np.uint16(schema.n_features).tobytes(), np.uint8)
    block[:, 4:8] = np.asarray(labels, "<i4").reshape(n, 1).view(np.uint8)
    payload = np.ascontiguousarray(flat, dtype=np.dtype(schema.dtype).newbyteorder("<"))
    block[:, HEADER_BYTES:] = payload.view(np.uint8).reshape(n, schema.record_bytes - HEADER_BYTES)
    return block


def encode(features: np.ndarray, labels: np.ndarray, schema: Schema) -> list[bytes]:
    """Encode N records as a list of Kafka values."""
    return [row.tobytes() for row in encode_block(features, labels, schema)]


@dataclasses.dataclass
class Decoded:
    """Records decoded from one block of values.

    Attributes:
        x: features of the accepted records, ``(n_ok, n_features)`` in the wire dtype.
        y: labels of the accepted records (int32).
        accepted: positions of the accepted records in the input.
        rejected: positions of the rejected records in the input.
        reasons: reason code of each rejected record (an index into ``names``).
        names: the reasons' names (a table's name the field: ``missing:island``).
    """

    x: np.ndarray
    y: np.ndarray
    accepted: np.ndarray
    rejected: np.ndarray
    reasons: np.ndarray
    names: tuple[str, ...] = REASONS

    def reject_counts(self) -> dict[str, int]:
        """Rejected records by reason name, only reasons that occurred."""
        codes, counts = np.unique(self.reasons, return_counts=True)
        return {self.names[c]: int(n) for c, n in zip(codes, counts, strict=True)}

    def reason_names(self) -> list[str]:
        """The reason of each rejected record, in input order."""
        return [self.names[c] for c in self.reasons]


def as_buffer(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """(data bytes, offsets) of a list of bytes or a pyarrow binary array, without copying
    pyarrow buffers."""
    if hasattr(values, "buffers") and hasattr(values, "offset"):  # a pyarrow (Large)BinaryArray
        _, off_buf, data_buf = values.buffers()
        off_type = np.int64 if "large" in str(values.type) else np.int32
        offsets = np.frombuffer(off_buf, off_type)[values.offset : values.offset + len(values) + 1]
        data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.empty(0, np.uint8)
        # A null value spans no bytes, so it fails the length check as wrong_length.
        return data, offsets.astype(np.int64, copy=False)
    values = [b"" if v is None else v for v in values]
    lengths = np.fromiter((len(v) for v in values), np.int64, len(values))
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return np.frombuffer(b"".join(values), np.uint8), offsets


def json_instances(schema: Schema) -> Schema:
    """``schema``'s features as JSON instances: a value is a list of numbers (flat or
    nested), ``{"instances": [one]}`` or ``{"features": [...]}``, in the wire units.

    >>> values = [b"[1, 2]", b'{"instances": [[3, 4]]}', b"[1]", b"oops"]
    >>> d = decode(values, json_instances(generic(2, 2)))
    >>> d.x.tolist(), d.reason_names()
    ([[1.0, 2.0], [3.0, 4.0]], ['not_an_instance', 'not_an_instance'])
    """
    return dataclasses.replace(schema, encoding="json")


def _json_instance(value: bytes | None, schema: Schema) -> np.ndarray | int:
    """The features of one JSON value, or the reason code it is rejected with."""
    import json

    try:
        body = json.loads(value or b"")
        if isinstance(body, dict):
            body = body["instances"][0] if "instances" in body else body["features"]
        if holds_bool(body):
            return _NOT_AN_INSTANCE
        x = np.asarray(body, dtype=np.float64).reshape(-1)
    except (ValueError, TypeError, KeyError, IndexError):
        return _NOT_AN_INSTANCE
    if x.size != schema.n_features:
        return _NOT_AN_INSTANCE
    if not np.isfinite(x).all():
        return _NON_FINITE
    if schema.dtype == "uint8" and (x.min() < 0 or x.max() > 255):
        return _NOT_AN_INSTANCE
    return x


def holds_bool(body: Any) -> bool:
    """Whether a parsed JSON instance holds true or false where numbers belong (numpy would
    take them as 1 and 0). Looks at the first level and the first element of each deeper
    one: checking every number would cost as much as parsing.

    >>> holds_bool([[1, 2], [3, 4]]), holds_bool([[True, 2]]), holds_bool([0, False])
    (False, True, True)
    """
    while isinstance(body, list) and body:
        if any(isinstance(v, bool) for v in body):
            return True
        body = body[0]
    return isinstance(body, bool)


def _decode_json(values: Any, schema: Schema) -> Decoded:
    raw = values.to_pylist() if hasattr(values, "to_pylist") else list(values)
    parsed = [_json_instance(v, schema) for v in raw]
    ok = [i for i, v in enumerate(parsed) if not isinstance(v, int)]
    bad = [i for i, v in enumerate(parsed) if isinstance(v, int)]
    rows = [parsed[i] for i in ok]
    x = (
        np.stack(rows).astype(schema.dtype)
        if rows
        else np.empty((0, schema.n_features), schema.dtype)
    )
    return Decoded(
        x=x,
        y=np.zeros(len(ok), np.int32),
        accepted=np.array(ok, np.int64),
        rejected=np.array(bad, np.int64),
        reasons=np.array([parsed[i] for i in bad], np.uint8),
    )


def decode(values: Any, schema: Schema) -> Decoded:
    """Decode a block of Kafka values in one vectorized pass.

    Args:
        values: a sequence of ``bytes`` or a pyarrow binary array.
        schema: the layout the values are expected to have.

    Returns:
        A :class:`Decoded`: the trainable records and the rejected ones with reasons.

    Example:
        >>> import numpy as np
        >>> ok = encode(np.array([[0.5, 1.0]], np.float32), np.array([1]), generic(2, 2))[0]
        >>> nan = encode(np.array([[np.nan, 1.0]], np.float32), np.array([1]), generic(2, 2))[0]
        >>> bad_label = encode(np.array([[0.5, 1.0]], np.float32), np.array([9]), generic(2, 2))[0]
        >>> decode([ok, nan, bad_label, b"\\x02" + ok[1:]], generic(2, 2)).reason_names()
        ['non_finite', 'label_out_of_range', 'unknown_version']
    """
    if schema.table is not None:
        return schema.table.decode(values)
    if schema.encoding == "json":
        return _decode_json(values, schema)
    data, offsets = as_buffer(values)
    n = len(offsets) - 1
    rec = schema.record_bytes
    lengths = np.diff(offsets)
    code = np.full(n, -1, np.int16)
    code[lengths != rec] = _WRONG_LENGTH
    good_len = code < 0
    n_good = int(good_len.sum())
    if n_good == n and n and offsets[-1] - offsets[0] == n * rec:
        rows = data[offsets[0] : offsets[-1]].reshape(n, rec)
    elif n_good:
        # Keep only the bytes of right-length records: a byte mask is O(bytes) and
        # avoids a Python loop over records.
        first, last = offsets[0], offsets[-1]
        keep = np.repeat(good_len, lengths)
        rows = data[first:last][keep].reshape(n_good, rec)
    else:
        rows = np.empty((0, rec), np.uint8)

    sub = np.full(n_good, -1, np.int16)
    labels = rows[:, 4:8].copy().view("<i4").ravel()
    count = rows[:, 2:4].copy().view("<u2").ravel()
    sub[(rows[:, 0] != VERSION) & (sub < 0)] = _UNKNOWN_VERSION
    wrong_schema = (rows[:, 1] != schema.schema_id) | (count != schema.n_features)
    sub[wrong_schema & (sub < 0)] = _WRONG_SCHEMA
    sub[((labels < 0) | (labels >= schema.num_classes)) & (sub < 0)] = _LABEL_RANGE
    features = rows[:, HEADER_BYTES:]
    if schema.dtype == "uint8":
        x = features
    else:
        x = np.ascontiguousarray(features).view(np.dtype(schema.dtype).newbyteorder("<"))
        x = x.astype(schema.dtype, copy=False)
        sub[~np.isfinite(x).all(axis=1) & (sub < 0)] = _NON_FINITE
    code[good_len] = sub

    ok_rows = sub < 0
    accepted = np.flatnonzero(code < 0)
    rejected = np.flatnonzero(code >= 0)
    x_ok = x[ok_rows] if not ok_rows.all() else x
    return Decoded(
        x=np.ascontiguousarray(x_ok),
        y=labels[ok_rows].astype(np.int32),
        accepted=accepted,
        rejected=rejected,
        reasons=code[rejected].astype(np.uint8),
    )
