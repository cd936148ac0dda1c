"""ID features: keys that travel in a record's row, and the model input their rows make.

An ``id`` column (a user, an item) reaches the model as its embedding row, looked up on the
parameter server by the ID itself. Until then the ID rides in the decoded block as its
64-bit key, split into three float32 lanes of at most 22 bits each (exact: float32 holds
every integer below 2**24), so that every path a block takes (decoding, masking, holding
out, Spark's partitions) carries it unchanged. A non-negative integer ID below 2**63 is its
own key; any other value (text) is the top half of the key space, by a 63-bit BLAKE2b hash
(two distinct texts collide with odds of about n**2 / 2**64: one in 10**7 for a million IDs);
a gap is :data:`GAP`, which reads the table's shared row.

Example:
    >>> keys = id_keys([42, "42", "alice", None, 7.0])
    >>> [int(k) for k in keys[[0, 1, 4]]], bool(keys[3] == GAP), bool(keys[2] >> np.uint64(63))
    ([42, 42, 7], True, True)
    >>> bool((from_lanes(to_lanes(keys).astype(np.float32)) == keys).all())
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.table.transform import text

#: The key of a missing ID: the shared row's (:data:`pipeline.train.ps.rows.SHARED`).
GAP = np.uint64(0xFFFFFFFFFFFFFFFF)
#: Float32 columns an ID takes in a decoded block, and the bits each holds.
LANES = 3
_BITS = (22, 21, 21)
_TEXT = 1 << 63


def id_key(value: Any) -> int:
    """One ID's key (see the module's docstring)."""
    t = text(value)
    if t is None:
        return int(GAP)
    if t.isdigit() and len(t) < 20 and int(t) < _TEXT:
        return int(t)
    h = int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "little")
    key = h | _TEXT
    return key if key != int(GAP) else key ^ 1


#: Text IDs' keys, kept per process: popular IDs recur in every batch (Zipf), and a hash costs
#: ~2 us where a look-up costs ~0.1. Emptied when full, so its memory stays bounded.
_TEXT_KEYS: dict[str, int] = {}
_MOST_TEXT_KEYS = 1 << 20


def id_keys(values: Sequence[Any]) -> np.ndarray:
    """The keys of a column of IDs, uint64.

    >>> id_keys(["u7", "u7", 7, [1]]).tolist()[:3] == [id_key("u7"), id_key("u7"), 7]
    True
    """
    known = _TEXT_KEYS
    if len(known) + len(values) > _MOST_TEXT_KEYS:
        known.clear()
    try:  # the known texts' keys in one C pass (only text is cached: True, 1 and 1.0 are
        # one dict key, not one ID, and they miss here)
        got = list(map(known.get, values))
    except TypeError:  # an unhashable value (a list, an object): each on its own
        got = [None] * len(values)
    for i in [i for i, k in enumerate(got) if k is None]:
        v = values[i]
        k = got[i] = id_key(v)
        if type(v) is str:
            known[v] = k
    return np.fromiter(got, np.uint64, len(values))


def to_lanes(keys: np.ndarray) -> np.ndarray:
    """Keys as ``(n, 3)`` float64 lane values (exact as float32)."""
    keys = np.asarray(keys, np.uint64)
    out = np.empty((len(keys), LANES), np.float64)
    shift = 0
    for i, bits in enumerate(_BITS):
        out[:, i] = (keys >> np.uint64(shift)) & np.uint64((1 << bits) - 1)
        shift += bits
    return out


def from_lanes(lanes: np.ndarray) -> np.ndarray:
    """Keys back from ``(n, 3)`` lane values."""
    lanes = np.asarray(lanes)
    keys = np.zeros(len(lanes), np.uint64)
    shift = 0
    for i, bits in enumerate(_BITS):
        keys |= lanes[:, i].astype(np.uint64) << np.uint64(shift)
        shift += bits
    return keys


@dataclasses.dataclass(frozen=True)
class IdColumn:
    """One ID feature's place: its lanes in the block, its table, its rows' size."""

    name: str
    lane: int
    table: str
    dim: int


class IdLayout:
    """How a schema with ID features turns a decoded block into the model's input: its other
    columns first, in order, then each ID feature's row, in order.

    Example:
        >>> from pipeline.table.schema import Feature, TableSchema
        >>> s = TableSchema(
        ...     (Feature("u", "id", dim=2), Feature("a"), Feature("i", "id", dim=3)), None
        ... )
        >>> layout = IdLayout(s)
        >>> x = np.zeros((1, s.width), np.float32)
        >>> x[0, 3] = 5.0
        >>> layout.dense.tolist(), layout.width, layout.tables()
        ([3], 6, {'u': 2, 'i': 3})
        >>> rows = {"u": np.ones((1, 2), np.float32), "i": np.full((1, 3), 2, np.float32)}
        >>> layout.assemble(x, rows).tolist()
        [[5.0, 1.0, 1.0, 2.0, 2.0, 2.0]]
    """

    def __init__(self, schema: Any) -> None:
        self.columns: list[IdColumn] = []
        dense: list[int] = []
        start = 0
        for f in schema.features:
            if f.kind == "id":
                self.columns.append(IdColumn(f.name, start, f.table or f.name, f.dim))
            else:
                dense.extend(range(start, start + f.width))
            start += f.width
        self.dense = np.array(dense, np.int64)
        self.width = len(dense) + sum(c.dim for c in self.columns)

    def tables(self) -> dict[str, int]:
        """Each table's name and its rows' size, in the order first named."""
        return {c.table: c.dim for c in self.columns}

    def keys(self, x: np.ndarray) -> list[np.ndarray]:
        """Each ID feature's keys in ``x``'s records."""
        return [from_lanes(x[:, c.lane : c.lane + LANES]) for c in self.columns]

    def assemble(self, x: np.ndarray, rows: dict[str, np.ndarray] | list[np.ndarray]) -> np.ndarray:
        """The model's input: ``x``'s other columns, then each ID feature's rows (by feature,
        ``(n, dim)`` each, as a list; or, with a dict, by table for a schema whose tables
        each serve one feature)."""
        parts = rows if isinstance(rows, list) else [rows[c.table] for c in self.columns]
        out = np.empty((len(x), self.width), np.float32)
        out[:, : len(self.dense)] = x[:, self.dense]
        at = len(self.dense)
        for c, part in zip(self.columns, parts, strict=True):
            out[:, at : at + c.dim] = part
            at += c.dim
        return out

    def row_gradients(self, grad: np.ndarray) -> list[np.ndarray]:
        """The input gradient's part for each ID feature, ``(n, dim)`` each."""
        at, out = len(self.dense), []
        for c in self.columns:
            out.append(grad[:, at : at + c.dim])
            at += c.dim
        return out
