"""Embedding rows on the parameter server, keyed by the ID itself: what a table of IDs (users,
items) is on a server, as Monolith keeps them. A row is created when its ID has been seen
``min_count`` times (until then the ID reads the table's shared row), trained with its own
Adagrad state, and dropped once not seen for ``ttl`` records. Memory is counted per table.

Everything a row is follows from the sequence of pulls and pushes it is given: its initial
values are a function of the run's seed, the table and the key, so a replay of the same
stream creates the same rows, and a table cut into shards by :func:`shard_of` holds, shard
by shard, exactly the rows one table would. A worker's exchange is a read (no effect) and a
push: the gradients of the rows it read (those without a row of their own summed into the
shared row's) and the sightings of every ID in its batch.

Example:
    >>> table = RowTable(RowSpec("item", dim=4, min_count=2, ttl=100))
    >>> keys = np.array([7, 9], dtype=np.uint64)
    >>> table.sight(keys, np.array([2, 1]), now=1), len(table)  # 7's second sighting: its row
    (1, 1)
    >>> values, has_row = table.read(keys)
    >>> has_row.tolist()  # 9 reads the shared row
    [True, False]
    >>> table.push(keys[:1], np.ones((1, 4), np.float32), now=2)
    1
    >>> bool((table.read(keys[:1])[0] < values[:1]).all())  # a step against the gradient
    True
    >>> table.expire(now=500), len(table)
    (1, 0)
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.train.ps.key_index import KeyIndex, ascending

#: The shared row's key: what an ID without a row of its own reads (and trains). Reserved: an
#: ID's key is a non-negative 64-bit integer or a 64-bit hash, never this one value.
SHARED = np.uint64(0xFFFFFFFFFFFFFFFF)
_ODD = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def mix64(keys: np.ndarray, salt: int = 0) -> np.ndarray:
    """64 well-mixed bits of each key (splitmix64's finalizer), salted.

    >>> keys = np.array([1, 2], dtype=np.uint64)
    >>> same, salted = mix64(keys), mix64(keys, salt=1)
    >>> same.tolist() == mix64(keys.copy()).tolist(), bool(salted[0] != same[0])
    (True, True)
    """
    with np.errstate(over="ignore"):
        z = np.asarray(keys, np.uint64) + np.uint64(salt & 0xFFFFFFFFFFFFFFFF) * _ODD[0]
        z = (z ^ (z >> np.uint64(30))) * _ODD[1]
        z = (z ^ (z >> np.uint64(27))) * _ODD[2]
        return z ^ (z >> np.uint64(31))


def shard_of(keys: np.ndarray, shards: int) -> np.ndarray:
    """The shard that holds each key: its mixed bits, modulo the shards.

    >>> np.bincount(shard_of(np.arange(10_000, dtype=np.uint64), 2)).tolist()
    [5061, 4939]
    """
    return (mix64(keys, salt=0x5EED) % np.uint64(shards)).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class RowSpec:
    """One table's settings.

    Args:
        name: the table's name (two ID columns may share one).
        dim: the rows' size.
        min_count: sightings before an ID gets a row of its own (frequency filtering).
        ttl: records after its last sighting that a row (or an ID's count) is dropped; None:
            kept for the run.
        learning_rate: the optimizer's step.
        optimizer: ``adagrad`` (each row its own sum of squared gradients) or ``sgd``.
        initial_accumulator: Adagrad's starting sum of squared gradients.
        init_scale: initial values are uniform in ``(-init_scale, init_scale)``.
        seed: the run's seed (initial values are a function of it, the table and the key).
    """

    name: str
    dim: int
    min_count: int = 1
    ttl: int | None = None
    learning_rate: float = 0.1  # the schema's (pipeline.table.id_settings.ROW_LEARNING_RATE)
    optimizer: str = "adagrad"
    initial_accumulator: float = 0.1
    init_scale: float = 0.05
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dim < 1 or self.min_count < 1 or (self.ttl is not None and self.ttl < 1):
            raise ConfigError(
                f"Expected dim >= 1, min_count >= 1 and ttl >= 1 (or none) for ID table "
                f"{self.name!r}. Received: dim={self.dim}, min_count={self.min_count}, "
                f"ttl={self.ttl}. Fix the schema's id feature."
            )

    def initial(self, keys: np.ndarray) -> np.ndarray:
        """The initial rows of ``keys``, ``(n, dim)`` float32: the same on every run."""
        salt = self.seed * 1_000_003 + zlib.crc32(self.name.encode())
        with np.errstate(over="ignore"):
            salted = mix64(np.asarray(keys, np.uint64), salt)
            lanes = mix64(salted[:, None] + np.arange(self.dim, dtype=np.uint64))  # all at once
        unit = (lanes >> np.uint64(11)).astype(np.float64) / float(1 << 53)
        return ((2.0 * unit - 1.0) * self.init_scale).astype(np.float32)


def _known(keys: np.ndarray, slots: np.ndarray, shared: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted ``keys`` and their ``slots``, with the shared row's key (the largest) and its
    slot ``shared`` at the end: what a push's keys are found among."""
    if len(keys) and keys[-1] == SHARED:
        return keys, slots
    return np.append(keys, SHARED), np.append(slots, shared)


def _reaching(
    pending: dict[int, tuple[int, int]],
    min_count: int,
    keys: np.ndarray,
    counts: np.ndarray,
    new: np.ndarray,
    *,
    now: int,
) -> np.ndarray:
    """Of the IDs at ``new`` (places in ``keys``, without rows), those whose sightings reach
    ``min_count`` with these ``counts``; the others' counts are kept in ``pending``."""
    born: list[int] = []
    for i, key, count in zip(
        new.tolist(), keys[new].tolist(), np.asarray(counts)[new].tolist(), strict=True
    ):
        seen = pending.get(key, (0, now))[0] + int(count)
        if seen >= min_count:
            pending.pop(key, None)
            born.append(i)
        else:
            pending[key] = (seen, now)
    return np.array(born, np.int64)


class RowTable:
    """One table's rows (or one shard's part of them).

    Reads have no effect (a worker's pull, a prediction, a retried task's pull alike):
    everything that changes a row comes with a push, which the server applies once
    (:mod:`pipeline.train.ps.tasks`). Rows live in arrays grown by half again, found by a
    vectorized hash index (:class:`~pipeline.train.ps.key_index.KeyIndex`); the slots of
    dropped rows are reused. IDs seen fewer than ``min_count`` times are only counted.
    """

    def __init__(self, spec: RowSpec, *, capacity: int = 1024) -> None:
        self.spec = spec
        self._index = KeyIndex(capacity)
        self._values = np.zeros((capacity, spec.dim), np.float32)
        self._accum = np.zeros((capacity, spec.dim), np.float32)
        self._last_seen = np.zeros(capacity, np.int64)
        self._keys = np.zeros(capacity, np.uint64)
        self._touched = np.zeros(capacity, bool)  # slots changed since the last delta
        self._free: list[int] = []
        self._used = 0
        #: Sightings of IDs without a row yet, and when each was last seen.
        self._pending: dict[int, tuple[int, int]] = {}
        self._dropped: set[int] = set()  # keys dropped since the last delta
        self.created = self.expired = 0
        self._shared = int(self._make(np.array([SHARED], np.uint64), now=0)[0])  # never expired

    def __len__(self) -> int:
        """Rows of IDs (the shared row not counted)."""
        return len(self._index) - 1

    def _make(self, keys: np.ndarray, *, now: int, at: np.ndarray | None = None) -> np.ndarray:
        """New rows for ``keys`` (absent, distinct; ``at``: :meth:`KeyIndex.look`'s places)."""
        reused = [self._free.pop() for _ in range(min(len(keys), len(self._free)))]
        fresh = len(keys) - len(reused)
        while self._used + fresh > len(self._keys):
            self._grow()
        slots = np.array(reused + list(range(self._used, self._used + fresh)), np.int64)
        self._used += fresh
        self._index.insert(keys, slots, at)
        self._keys[slots] = keys
        self._values[slots] = self.spec.initial(keys)
        self._accum[slots] = self.spec.initial_accumulator
        self._last_seen[slots] = now
        self._touched[slots] = True
        return slots

    def _grow(self) -> None:
        """Half again as many slots (at least 1,024 more)."""
        size = len(self._keys) + max(1024, len(self._keys) // 2)
        for name in ("_values", "_accum", "_last_seen", "_keys", "_touched"):
            old = getattr(self, name)
            new = np.zeros((size, *old.shape[1:]), old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)

    def read(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The rows of ``keys`` (an ID without a row reads the shared row), and which keys have
        a row of their own. Changes nothing."""
        return self._rows_at(self._index.find(keys))

    def _rows_at(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._values[np.where(slots >= 0, slots, self._shared)], slots >= 0

    def apply(
        self,
        push: tuple[np.ndarray, np.ndarray],
        sighted: tuple[np.ndarray, np.ndarray],
        read: np.ndarray,
        *,
        now: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """A worker's request: :meth:`push` ``(keys, gradients)``, :meth:`sight` ``(keys,
        counts)``, :meth:`read`. A look-up's fixed cost is most of it at a mini-batch's few
        hundred keys: the sighted and read keys are looked up at once, and the pushed ones
        (sorted, as the sighted are, of which they are those with rows) found among those."""
        pkeys, skeys, read = (np.asarray(k, np.uint64) for k in (push[0], sighted[0], read))
        slots, ends = self._index.look(np.concatenate([skeys, read]))
        seen, reads = slots[: len(skeys)], slots[len(skeys) :]
        index, known = self._index, _known(skeys, seen, self._shared)
        self.push(pkeys, push[1], now=now, slots=index.among(pkeys, *known))
        made, at = self._sight(skeys, sighted[1], now=now, slots=seen, ends=ends[: len(skeys)])
        if len(made) and (gap := reads < 0).any():  # rows this sighting made; the rest none
            reads[gap] = index.among(read[gap], made, at, absent=True)
        return self._rows_at(reads)

    def push(
        self, keys: np.ndarray, gradients: np.ndarray, *, now: int, slots: np.ndarray | None = None
    ) -> int:
        """A step of the table's optimizer on the rows of ``keys`` (repeated keys' gradients
        summed), each now seen at ``now``; a key whose row is gone has its gradient dropped.
        Returns the rows stepped. ``slots``: the keys' (:meth:`apply`'s look-up)."""
        keys = np.asarray(keys, np.uint64)
        slots = self._index.find(keys) if slots is None else slots
        live = slots >= 0
        if not live.any():
            return 0
        grads = np.asarray(gradients, np.float32)[live]
        if ascending(keys):  # distinct keys, as a worker sends them: distinct rows
            unique, summed = slots[live], grads
        else:
            unique, inverse = np.unique(slots[live], return_inverse=True)
            summed = np.zeros((len(unique), self.spec.dim), np.float32)
            np.add.at(summed, inverse, grads)
        if self.spec.optimizer == "sgd":
            self._values[unique] -= self.spec.learning_rate * summed
        else:
            accum = self._accum[unique] + summed * summed
            self._accum[unique] = accum
            self._values[unique] -= self.spec.learning_rate * summed / np.sqrt(accum)
        self._last_seen[unique] = np.maximum(self._last_seen[unique], now)
        self._touched[unique] = True
        return len(unique)

    def sight(
        self, keys: np.ndarray, counts: np.ndarray, *, now: int, slots: np.ndarray | None = None
    ) -> int:
        """Count sightings of IDs (``keys`` distinct, ``counts`` each) at ``now``: a row's expiry
        moves; an ID without one gets it once seen ``min_count`` times. Returns rows created."""
        return len(self._sight(keys, counts, now=now, slots=slots)[0])

    def _sight(
        self, keys: np.ndarray, counts: np.ndarray, *, now: int, slots: Any, ends: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`sight`'s new rows' keys and slots (``ends``: :meth:`KeyIndex.look`'s)."""
        keys = np.asarray(keys, np.uint64)
        slots = self._index.find(keys) if slots is None else slots
        rowed = slots[(slots >= 0) & (slots != self._shared)]
        moved = rowed[self._last_seen[rowed] < now]
        self._last_seen[moved] = now
        self._touched[moved] = True
        new = np.flatnonzero(slots < 0)
        if self.spec.min_count > 1:  # counted until they reach it
            new = _reaching(self._pending, self.spec.min_count, keys, counts, new, now=now)
        at = None if ends is None else ends[new]
        made = self._make(keys[new], now=now, at=at) if len(new) else new
        self.created += len(new)
        return keys[new], made

    def expire(self, *, now: int) -> int:
        """Drop the rows, and the pending counts, not seen for ``ttl`` records before ``now``.
        Returns the rows dropped."""
        if self.spec.ttl is None:
            return 0
        cutoff = now - self.spec.ttl
        keys, slots = self._index.items()
        old = (self._last_seen[slots] < cutoff) & (slots != self._shared)
        gone_keys, gone_slots = keys[old], slots[old]
        self._index.remove(gone_keys)
        self._free.extend(gone_slots.tolist())
        self._touched[gone_slots] = False
        self._dropped.update(gone_keys.tolist())
        self._pending = {k: v for k, v in self._pending.items() if v[1] >= cutoff}
        self.expired += len(gone_keys)
        return len(gone_keys)

    def nbytes(self) -> int:
        """The table's memory: its arrays as allocated (values, optimizer state, key, last
        seen), its index, and its pending counts (a dict: ~100 bytes each)."""
        arrays = sum(
            a.nbytes
            for a in (self._values, self._accum, self._last_seen, self._keys, self._touched)
        )
        return arrays + self._index.nbytes + len(self._pending) * 100

    def row_bytes(self) -> int:
        """What one row's values and optimizer state take as float32 (the floor of its cost)."""
        return 2 * 4 * self.spec.dim

    def _export(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        order = np.argsort(self._keys[slots], kind="stable")
        slots = slots[order]
        return {
            "keys": self._keys[slots].copy(),
            "values": self._values[slots].copy(),
            "accum": self._accum[slots].copy(),
            "last_seen": self._last_seen[slots].copy(),
        }

    def rows(self, keys: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """Rows as arrays (``keys``, ``values``, ``accum``, ``last_seen``), sorted by key:
        those of ``keys`` that exist, or all (the shared row included)."""
        if keys is None:
            return self._export(self._index.items()[1])
        slots = self._index.find(np.asarray(keys, np.uint64))
        return self._export(np.unique(slots[slots >= 0]))

    def pending(self) -> dict[str, np.ndarray]:
        """The counts of IDs without a row: ``keys``, ``seen``, ``last_seen``, sorted by key."""
        order = sorted(self._pending)
        got = [self._pending[k] for k in order]
        return {
            "keys": np.array(order, np.uint64),
            "seen": np.array([g[0] for g in got], np.int64),
            "last_seen": np.array([g[1] for g in got], np.int64),
        }

    def delta(self) -> dict[str, Any]:
        """What changed since the last delta (or snapshot): the rows touched, the keys
        dropped and the pending counts; taking it starts the next."""
        out = {
            "rows": self._export(np.flatnonzero(self._touched)),
            "dropped": np.array(sorted(self._dropped), np.uint64),
            "pending": self.pending(),
        }
        self._touched[:] = False
        self._dropped.clear()
        return out

    def snapshot(self) -> dict[str, Any]:
        """Every row and pending count; the next delta starts from here."""
        self._touched[:] = False
        self._dropped.clear()
        return {
            "snapshot": True,
            "rows": self.rows(),
            "dropped": np.zeros(0, np.uint64),
            "pending": self.pending(),
        }

    def load(self, change: dict[str, Any]) -> None:
        """Apply a snapshot (the table becomes it) or a delta (its dropped keys go, its rows
        are set); either's pending counts replace the table's."""
        if change.get("snapshot"):
            keys, slots = self._index.items()
            others = slots != self._shared
            self._index.remove(keys[others])
            self._free.extend(slots[others].tolist())
        dropped = np.asarray(change["dropped"], np.uint64)
        if len(dropped):
            slots = self._index.find(dropped)
            self._index.remove(dropped[slots >= 0])
            self._free.extend(slots[slots >= 0].tolist())
        rows = change["rows"]
        keys = np.asarray(rows["keys"], np.uint64)
        slots = self._index.find(keys)
        missing = slots < 0
        if missing.any():
            slots[missing] = self._make(keys[missing], now=0)
        self._values[slots] = rows["values"]
        self._accum[slots] = rows["accum"]
        self._last_seen[slots] = rows["last_seen"]
        p = change["pending"]
        self._pending = {
            int(k): (int(s), int(t))
            for k, s, t in zip(
                p["keys"].tolist(), p["seen"].tolist(), p["last_seen"].tolist(), strict=True
            )
        }
        self._touched[:] = False
        self._dropped.clear()
