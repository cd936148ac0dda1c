"""The vectorized key index agrees with a dict through inserts, removals and rebuilds, whether
an insert probes or takes the places its look-up found."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.train.ps.key_index import KeyIndex


@pytest.mark.parametrize("placed", [False, True], ids=["probing", "placed"])
def test_the_index_answers_as_a_dict_does_through_inserts_removals_and_rebuilds(
    placed: bool,
) -> None:
    rng = np.random.default_rng(4)
    index, truth = KeyIndex(capacity=16), {}
    next_slot = 0
    for _ in range(200):  # bounded: 200 rounds of a few hundred keys
        keys = np.unique(
            np.concatenate(
                [
                    rng.integers(0, 5_000, 300).astype(np.uint64),  # dense small keys collide
                    rng.integers(0, 2**63, 20, dtype=np.int64).astype(np.uint64) | (1 << 63),
                ]
            )
        )
        found, ends = index.look(keys)
        missing = found < 0
        assert ((ends >= 0) == missing).all()  # a place for each absent key, none for the rest
        absent = np.array([k for k in keys.tolist() if k not in truth], np.uint64)
        assert absent.tolist() == keys[missing].tolist()
        slots = np.arange(next_slot, next_slot + len(absent))
        next_slot += len(absent)
        # Placed: keys that end at one empty position (small keys collide) share it out.
        index.insert(absent, slots, ends[missing] if placed else None)
        truth.update(zip(absent.tolist(), slots.tolist(), strict=True))
        gone = rng.choice(keys, size=len(keys) // 3, replace=False)
        index.remove(gone)
        for k in gone.tolist():
            truth.pop(k, None)
        probe = np.concatenate([keys, rng.integers(0, 10_000, 100).astype(np.uint64)])
        assert index.find(probe).tolist() == [truth.get(k, -1) for k in probe.tolist()]
        assert len(index) == len(truth)
    keys, slots = index.items()
    assert dict(zip(keys.tolist(), slots.tolist(), strict=True)) == truth
    assert index.nbytes <= 48 * len(truth) + 16 * 300  # at most half full, a third after
