"""Embedding rows keyed by the ID: created after min_count sightings, expired by ttl, the same
rows whatever the shards, and a table rebuilt from a snapshot and its deltas equal to one that
never stopped (issue 56's tables, before they go on the wire)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.train.ps.rows import SHARED, RowSpec, RowTable
from pipeline.train.ps.sharded_rows import ShardedRows


def _stream(
    batches: int, *, seed: int = 1, drift: int = 0
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Bounded batches of Zipf-popular keys (repeats within a batch), with gradients; ``drift``
    moves the key space on by that much per batch (new IDs arrive, old ones stop)."""
    rng = np.random.default_rng(seed)
    for b in range(batches):
        keys = (rng.zipf(1.3, 200) % 5_000 + b * drift).astype(np.uint64)
        yield b + 1, keys, rng.normal(size=(200, 4)).astype(np.float32)


def _run(tables: ShardedRows, batches: Iterator[tuple[int, np.ndarray, np.ndarray]]) -> None:
    for now, keys, grads in batches:
        _, has_row = tables.read(keys)
        tables.push(keys, grads, has_row, now=now * 200)
        if now % 10 == 0:
            tables.expire(now=now * 200)


def _shared(tables: ShardedRows) -> np.ndarray:
    rows = tables.rows()
    return rows["values"][rows["keys"] == SHARED][0]


def test_an_id_gets_its_row_at_its_min_count_th_sighting_and_reads_the_shared_row_before() -> None:
    spec = RowSpec("item", dim=4, min_count=3, seed=5)
    table = ShardedRows(spec, 1)
    key = np.array([42], np.uint64)
    first = _shared(table)
    for seen in (1, 2):
        values, has_row = table.read(key)
        assert not has_row[0] and np.array_equal(values[0], _shared(table)), seen
        table.push(key, np.ones((1, 4), np.float32), has_row, now=seen)  # trains the shared row
    assert not np.array_equal(_shared(table), first) and len(table) == 0
    table.push(key, np.ones((1, 4), np.float32), has_row, now=3)  # the third sighting
    values, has_row = table.read(key)
    assert has_row[0] and len(table) == 1
    # Its initial values: a function of the seed, the table and the key alone.
    assert np.array_equal(values[0], spec.initial(key)[0])
    assert not np.array_equal(values[0], RowSpec("item", dim=4, seed=6).initial(key)[0])
    assert not np.array_equal(values[0], RowSpec("user", dim=4, seed=5).initial(key)[0])


def test_rows_and_counts_not_seen_for_ttl_records_are_dropped_and_memory_stays_bounded() -> None:
    spec = RowSpec("item", dim=4, min_count=1, ttl=2_000)
    table = RowTable(spec)
    sizes = []
    for now, keys, _ in _stream(200, drift=50):
        unique, counts = np.unique(keys, return_counts=True)
        table.sight(unique, counts, now=now * 200)
        if now % 10 == 0:
            table.expire(now=now * 200)
            sizes.append((len(table), table.nbytes()))
    assert table.expired > 0 and table.created > len(table)
    half = len(sizes) // 2
    assert max(n for n, _ in sizes[half:]) <= 1.1 * max(n for n, _ in sizes[:half])
    # A dropped ID seen again starts afresh, from its initial values.
    gone = np.array([next(iter(sorted(table._dropped)))], np.uint64)
    table.sight(gone, np.ones(1), now=10**6)
    values, has_row = table.read(gone)
    assert has_row[0] and np.array_equal(values[0], spec.initial(gone)[0])


def test_two_shards_hold_exactly_the_rows_one_table_holds() -> None:
    spec = RowSpec("item", dim=4, min_count=2, ttl=3_000)
    one, two = ShardedRows(spec, 1), ShardedRows(spec, 2)
    _run(one, _stream(60))
    _run(two, _stream(60))
    a, b = one.rows(), two.rows()
    assert len(a["keys"]) > 100 and SHARED in a["keys"]
    for field in a:
        assert np.array_equal(a[field], b[field]), field
    assert all(len(shard) > 0 for shard in two.shards)


def test_a_table_rebuilt_from_a_snapshot_and_its_deltas_equals_one_that_never_stopped() -> None:
    spec = RowSpec("item", dim=4, min_count=2, ttl=3_000)
    batches = list(_stream(60))
    kept = ShardedRows(spec, 1)
    changes = []
    for i in range(0, 40, 10):
        _run(kept, iter(batches[i : i + 10]))
        table = kept.shards[0]
        changes.append(table.snapshot() if i == 0 else table.delta())
    resumed = ShardedRows(spec, 1)
    for change in changes:
        resumed.shards[0].load(change)
    for field, values in kept.rows().items():
        assert np.array_equal(values, resumed.rows()[field]), field
    # A push whose gradients were all the shared row's still moves its IDs' expiry: the next
    # delta carries it to a table that did not see it.
    keys = batches[40][1]
    kept.push(keys, np.zeros((len(keys), 4), np.float32), np.zeros(len(keys), bool), now=8_001)
    resumed.shards[0].load(kept.shards[0].delta())
    for field, values in kept.rows().items():
        assert np.array_equal(values, resumed.rows()[field]), field
    # A snapshot replaces what a table held (rows it lacks are gone).
    stale = ShardedRows(spec, 1)
    _run(stale, iter(batches[50:]))
    stale.shards[0].load(kept.shards[0].snapshot())
    for field, values in kept.rows().items():
        assert np.array_equal(values, stale.rows()[field]), field
    # Both go on alike from there.
    _run(kept, iter(batches[40:]))
    _run(resumed, iter(batches[40:]))
    for field, values in kept.rows().items():
        assert np.array_equal(values, resumed.rows()[field]), field


@pytest.mark.parametrize("settings", [{"dim": 0}, {"dim": 4, "min_count": 0}, {"dim": 4, "ttl": 0}])
def test_bad_settings_are_one_clear_error(settings: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match="Expected dim >= 1, min_count >= 1"):
        RowSpec("item", **settings)


@pytest.mark.parametrize("grouped", [False, True], ids=["repeats", "grouped"])
@pytest.mark.parametrize("min_count", [1, 2])
def test_a_request_applied_in_one_look_up_equals_its_push_sightings_and_read_one_by_one(
    min_count: int, grouped: bool
) -> None:
    """Proves: ``apply`` (the row server's path: one index look-up for a request's keys)
    reads and leaves exactly what push, sight and read called in turn do, rows created by
    the request's own sightings included, duplicate gradients summed as before; whether the
    push comes grouped, as a worker sends it (sorted, distinct, the shared row's key last:
    found among the sighted keys), or not (looked up)."""
    spec = RowSpec("item", dim=4, min_count=min_count, ttl=3_000, seed=3)
    one, apart = RowTable(spec), RowTable(spec)
    batches = list(_stream(40, drift=40))
    for (now, keys, grads), (_, following, _) in zip(batches, batches[1:], strict=False):
        seen, counts = np.unique(keys, return_counts=True)
        pushed = np.concatenate([keys, keys[:5]])  # repeats: summed, not a permutation
        twice = np.concatenate([grads, grads[:5]])
        if grouped:
            pushed, twice = np.append(seen, SHARED), grads[: len(seen) + 1]
        got = one.apply((pushed, twice), (seen, counts), following, now=now)
        apart.push(pushed, twice, now=now)
        apart.sight(seen, counts, now=now)
        want = apart.read(following)
        assert all((g == w).all() for g, w in zip(got, want, strict=True))
        if now % 10 == 0:
            assert one.expire(now=now * 100) == apart.expire(now=now * 100)
    a, b = one.rows(), apart.rows()
    assert all((a[k] == b[k]).all() for k in a) and one.created == apart.created > 0
