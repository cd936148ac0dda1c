"""The vectorized key index agrees with a dict through inserts, removals and rebuilds."""

from __future__ import annotations

import numpy as np

from pipeline.train.ps.key_index import KeyIndex


def test_the_index_answers_as_a_dict_does_through_inserts_removals_and_rebuilds() -> None:
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
        absent = np.array([k for k in keys.tolist() if k not in truth], np.uint64)
        slots = np.arange(next_slot, next_slot + len(absent))
        next_slot += len(absent)
        index.insert(absent, slots)
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
