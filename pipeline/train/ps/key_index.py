"""A hash index from 64-bit keys to slots, in numpy arrays: what an ID table finds its rows
by, a whole batch of keys per call.

Open addressing with linear probing over a table kept at most half full (a third after each
rebuild), so a lookup takes a probe or two; every probe round is one vectorized pass over
the keys still looking, until a handful are left (the ends of a batch's longest chains), which
go on one at a time. A removed key leaves a tombstone (the probe chains through it go on)
until the table is rebuilt. It costs 16 bytes a position, 32 to 48 a key: a Python dict's
entry costs ~100.

Example:
    >>> index = KeyIndex()
    >>> index.insert(np.array([7, 9, 2**63 + 5], np.uint64), np.array([0, 1, 2]))
    >>> index.find(np.array([9, 8, 2**63 + 5], np.uint64)).tolist()
    [1, -1, 2]
    >>> index.remove(np.array([9], np.uint64)); len(index), index.find(np.array([9], np.uint64))
    (2, array([-1]))
"""

from __future__ import annotations

import numpy as np

_EMPTY, _GONE = -1, -2
#: Keys still probing after a round, at most, that go on one at a time: a vectorized round
#: costs tens of microseconds however few keys it takes, and the longest chains of a batch
#: (a dozen probes) would otherwise take a round each, for a handful of keys.
_ONE_BY_ONE = 16
_ODD = np.uint64(0x9E3779B97F4A7C15)


def _hash(keys: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = keys * _ODD
        return z ^ (z >> np.uint64(29))


def ascending(keys: np.ndarray) -> bool:
    """Whether ``keys`` are strictly ascending (so distinct): what np.unique gives.

    >>> ascending(np.array([1, 5, 9], np.uint64)), ascending(np.array([1, 1], np.uint64))
    (True, False)
    """
    return bool((keys[1:] > keys[:-1]).all())


class KeyIndex:
    """uint64 key -> int64 slot (a row's place in its table's arrays)."""

    def __init__(self, capacity: int = 1024) -> None:
        size = max(16, 3 * capacity)
        self._keys = np.zeros(size, np.uint64)
        self._slots = np.full(size, _EMPTY, np.int64)
        self._live = 0
        self._gone = 0

    def __len__(self) -> int:
        return self._live

    @property
    def nbytes(self) -> int:
        return self._keys.nbytes + self._slots.nbytes

    def _locate(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each key's position in the table, -1 where absent; and where each absent key's
        probe ended, the empty position an insert would take (-1 for those present)."""
        keys = np.asarray(keys, np.uint64)
        size = len(self._keys)
        pos = (_hash(keys) % np.uint64(size)).astype(np.int64)
        out = np.full(len(keys), -1, np.int64)
        ends = np.full(len(keys), -1, np.int64)
        todo = np.arange(len(keys))
        while todo.size > _ONE_BY_ONE:
            p = pos[todo]
            slot = self._slots[p]
            hit = (slot >= 0) & (self._keys[p] == keys[todo])
            out[todo[hit]] = p[hit]
            empty = slot == _EMPTY
            ends[todo[empty]] = p[empty]
            todo = todo[~hit & ~empty]  # past another key, or a tombstone
            pos[todo] = (pos[todo] + 1) % size
        stored, slots = self._keys, self._slots
        for i in todo.tolist():
            at, key = int(pos[i]), keys[i]
            while slots[at] != _EMPTY:
                if slots[at] >= 0 and stored[at] == key:
                    out[i] = at
                    break
                at = (at + 1) % size
            else:
                ends[i] = at
        return out, ends

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Each key's slot, -1 where absent."""
        return self.look(keys)[0]

    def look(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each key's slot (-1 where absent), and for the absent ones where an :meth:`insert`
        right after may place them (its ``at``; -1 for those present)."""
        at, ends = self._locate(keys)
        return np.where(at >= 0, self._slots[np.maximum(at, 0)], -1), ends

    def among(
        self, keys: np.ndarray, known: np.ndarray, slots: np.ndarray, *, absent: bool = False
    ) -> np.ndarray:
        """The slots of ``keys``, taken from ``known`` keys' ``slots`` where ``known`` is sorted
        and holds them (one binary search, not a look-up); the others looked up, or -1 where
        the caller knows them ``absent``.

        >>> index = KeyIndex(); index.insert(np.array([4], np.uint64), np.array([7]))
        >>> index.among(np.array([2, 4, 9], np.uint64), np.array([2, 9], np.uint64),
        ...     np.array([0, 1])).tolist()
        [0, 7, 1]
        """
        if not len(keys) or not len(known) or not ascending(known):
            return self.find(keys)
        at = np.minimum(np.searchsorted(known, keys), len(known) - 1)
        hit = known[at] == keys
        out = np.where(hit, slots[at], -1)
        if not absent and not hit.all():
            out[~hit] = self.find(keys[~hit])
        return out

    def insert(self, keys: np.ndarray, slots: np.ndarray, at: np.ndarray | None = None) -> None:
        """Add ``keys`` (distinct, none present) at ``slots``. ``at``: where :meth:`look`
        found each key's probe ending, with no insert since: a key whose position is still
        empty, and no other's, takes it without probing again (the others probe)."""
        keys = np.asarray(keys, np.uint64)
        slots = np.asarray(slots, np.int64)
        if 2 * (self._live + self._gone + len(keys)) > len(self._keys):
            self._rebuild(self._live + len(keys))
            at = None  # the positions moved
        if at is not None and len(keys):
            at = np.asarray(at, np.int64)
            mine = np.arange(len(keys))
            free = (at >= 0) & (self._slots[np.maximum(at, 0)] == _EMPTY)
            # Two keys may end at one empty position: each marks it, and the one whose mark
            # stays takes it (a mark is below _GONE, so never a slot nor a marker of state).
            self._slots[at[free]] = -3 - mine[free]
            won = np.zeros(len(keys), bool)
            won[free] = self._slots[at[free]] == -3 - mine[free]
            self._keys[at[won]], self._slots[at[won]] = keys[won], slots[won]
            self._live += int(won.sum())
            keys, slots = keys[~won], slots[~won]
        self._probe_in(keys, slots)

    def _probe_in(self, keys: np.ndarray, slots: np.ndarray) -> None:
        """Add ``keys`` at ``slots``, each at the first free position of its probe chain."""
        if not len(keys):
            return
        size = len(self._keys)
        pos = (_hash(keys) % np.uint64(size)).astype(np.int64)
        todo = np.arange(len(keys))
        while todo.size > _ONE_BY_ONE:
            p = pos[todo]
            free = self._slots[p] < 0
            # Where two keys probe one free position at once, the first takes it.
            taken, first = np.unique(p[free], return_index=True)
            winners = todo[free][first]
            self._gone -= int((self._slots[taken] == _GONE).sum())
            self._keys[taken] = keys[winners]
            self._slots[taken] = slots[winners]
            placed = np.zeros(len(keys), bool)
            placed[winners] = True
            todo = todo[~placed[todo]]
            pos[todo] = (pos[todo] + 1) % size
        for i in todo.tolist():  # in order: the first of two keys on one position takes it
            at = int(pos[i])
            while self._slots[at] >= 0:
                at = (at + 1) % size
            self._gone -= int(self._slots[at] == _GONE)
            self._keys[at], self._slots[at] = keys[i], slots[i]
        self._live += len(keys)

    def remove(self, keys: np.ndarray) -> None:
        """Remove ``keys`` (those absent are ignored)."""
        at = self._locate(keys)[0]
        at = at[at >= 0]
        self._slots[at] = _GONE
        self._live -= len(at)
        self._gone += len(at)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """Every key and its slot."""
        live = self._slots >= 0
        return self._keys[live].copy(), self._slots[live].copy()

    def _rebuild(self, need: int) -> None:
        keys, slots = self.items()
        size = max(16, 3 * need)  # a third full after
        self._keys = np.zeros(size, np.uint64)
        self._slots = np.full(size, _EMPTY, np.int64)
        self._live = self._gone = 0
        self.insert(keys, slots)
