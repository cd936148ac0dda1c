"""The row servers on the wire: the tables two shards make equal one shard's, a step's push
applied once however often it comes, and what the servers refuse (issue 56)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.train import table_store
from pipeline.train.ps import protocol as p
from pipeline.train.ps.row_client import RowClient
from pipeline.train.ps.rows import RowSpec
from pipeline.train.row_servers import RowServers

SPECS = [RowSpec("user", dim=4, min_count=2, ttl=3_000, seed=3), RowSpec("item", dim=2, seed=3)]


def _drive(
    rows: RowServers, *, steps: int = 60, repeat_every: int = 0, task: int = 42
) -> RowClient:
    """A worker's loop: read the step's unique keys, push their gradients and sightings (every
    ``repeat_every``-th step pushed twice, as a retried task would), move the clock."""
    rng = np.random.default_rng(11)
    client = RowClient(rows.addresses, secret=b"k", worker=1, dims=rows.dims)
    for step in range(1, steps + 1):
        keys = [(rng.zipf(1.3, 64) % 3_000 + step * 10).astype(np.uint64) for _ in rows.specs]
        uniques = [np.unique(k) for k in keys]
        got = client.exchange(uniques)
        push = []
        for t, k in enumerate(keys):
            at = np.searchsorted(uniques[t], k)
            values, has_row = got[t][0][at], got[t][1][at]
            push.append((k, (values - 0.1).astype(np.float32), has_row))  # a gradient of its rows
        client.push(push, task=task, exchange=step)
        if repeat_every and step % repeat_every == 0:
            client.push(push, task=task, exchange=step)  # a repeat: dropped
        if step % 10 == 0:
            rows.advance(640)
    return client


@pytest.mark.parametrize("processes", [False, True], ids=["here", "processes"])
def test_two_row_server_shards_make_exactly_one_shards_tables(processes: bool) -> None:
    """Proves: two shards, in this process or each in a process of its own (a run's), make
    the tables one shard makes, and drop each repeated push once; in processes, every
    request's seconds reach the driver's metrics at the next stats."""
    seconds: list[float] = []
    with (
        RowServers(SPECS, secret=b"k", host="127.0.0.1") as one,
        RowServers(
            SPECS,
            secret=b"k",
            host="127.0.0.1",
            shards=2,
            processes=processes,
            on_request=lambda _op, s: seconds.append(s),
        ) as two,
    ):
        _drive(one).close()
        client = _drive(two, repeat_every=7)
        client.close()
        for t in range(len(SPECS)):
            a, b = one.table_rows(t), two.table_rows(t)
            assert len(a["keys"]) > 50
            for field in a:
                assert np.array_equal(a[field], b[field]), (SPECS[t].name, field)
        assert two.now == one.now == 6 * 640
        stats = two.stats()
        # Each shard answered the 60 reads, the 60 pushes and the 8 repeats. A request's
        # seconds are counted after its answer is sent, so the last may come a moment after
        # the client has it (seen on 2 busy cores): waited for, with a deadline; a shard in a
        # process of its own hands its seconds over at the next stats.
        expected, deadline = 2 * (60 + 60 + 60 // 7), time.monotonic() + 10
        while len(seconds) < expected and time.monotonic() < deadline:
            time.sleep(0.01)
            stats = two.stats()
        assert len(seconds) == expected, len(seconds)
        assert bool(two.servers) != processes
        assert all(s["tables"]["user"]["rows"] for s in two._each("stats"))  # both hold rows
        assert stats["repeats_dropped"] == 2 * (60 // 7)  # each shard dropped each repeat
        assert stats["tables"]["user"]["expired"] > 0 and client.repeats == 60 // 7
        assert stats["rows_pushed"] > 0 and stats["rows_read"] > 0
        children = [proc for proc, _ in two._children.procs] if two._children else []
    assert len(children) == 2 * processes
    assert all(proc.poll() is not None for proc in children)  # stopped, by pid


def test_a_shard_process_that_refuses_a_request_leaves_the_next_in_step() -> None:
    """Proves: where the first of two shard processes answers an error, the error is raised
    once every answer is read, so the next request reads its own answers, not the last's."""
    from pipeline.errors import StreamtrainError

    with RowServers(SPECS, secret=b"k", host="127.0.0.1", shards=2, processes=True) as rows:
        with pytest.raises(StreamtrainError, match=r"Row-server shard 0: IndexError"):
            rows._each("rows", [99, 0])  # no table 99 on shard 0; shard 1 answers
        assert rows.stats()["tables"]["user"]["rows"] == 0


def test_a_push_that_trains_a_record_again_does_not_count_its_ids_as_seen_again() -> None:
    """Proves: with ``sighting`` off (a record's later pass, a replay after a drift), a push
    trains the rows it names but counts no sighting, so ``min_count`` counts records, not
    passes: an ID seen once, then pushed again without sighting, has no row of its own; a
    second sighting gives it one."""
    with (
        RowServers(SPECS, secret=b"k", host="127.0.0.1") as rows,
        RowClient(rows.addresses, secret=b"k", worker=1, dims=rows.dims) as client,
    ):
        keys = np.array([5, 9], np.uint64)

        def push(exchange: int) -> None:
            zeros = np.zeros(2, bool)
            client.push(
                [
                    (keys, np.ones((2, 4), np.float32), zeros),
                    (keys, np.ones((2, 2), np.float32), zeros),
                ],
                task=7,
                exchange=exchange,
            )

        push(1)
        client.sighting = False
        push(2)
        assert not client.exchange([keys, keys[:0]])[0][1].any()  # min_count 2: one sighting
        client.sighting = True
        push(3)
        assert client.exchange([keys, keys[:0]])[0][1].all()


def test_a_row_server_refuses_a_wrong_secret_and_a_gradient_that_is_not_finite() -> None:
    with RowServers(SPECS, secret=b"k", host="127.0.0.1") as rows:
        with pytest.raises(p.ProtocolError, match="refused this worker's proof"):
            RowClient(rows.addresses, secret=b"wrong", worker=1, dims=rows.dims)
        with RowClient(rows.addresses, secret=b"k", worker=1, dims=rows.dims) as client:
            keys = np.array([1, 2], np.uint64)
            bad = np.full((2, 4), np.nan, np.float32)
            with pytest.raises(p.ProtocolError, match="nonfinite"):
                client.push(
                    [
                        (keys, bad, np.ones(2, bool)),
                        (keys, np.zeros((2, 2), np.float32), np.ones(2, bool)),
                    ]
                )
        refused = rows.servers[0].stats()["refused"]
        assert refused.get("auth") == 1 and refused.get("nonfinite") == 1


def test_a_row_server_refuses_keys_of_another_shard() -> None:
    rows = RowServers(SPECS, secret=b"k", host="127.0.0.1", shards=2).start()
    # A client that believes in one shard sends every key to the first.
    client = RowClient(rows.addresses[:1], secret=b"k", worker=1, dims=rows.dims)
    try:
        with pytest.raises(p.ProtocolError, match="refused"):
            client.exchange([np.arange(100, dtype=np.uint64), np.zeros(0, np.uint64)])
    finally:
        client.close()
        rows.stop()


@pytest.mark.parametrize("shards", [1, 3])
def test_tables_saved_from_two_shards_resume_on_any_number(shards: int, tmp_path: Path) -> None:
    """A resumed run may name another --ps-shards: each row goes to the shard its key names."""
    with RowServers(SPECS, secret=b"k", host="127.0.0.1", shards=2) as two:
        entry = None
        for batch in range(3):  # a snapshot, then two deltas
            _drive(two, steps=20, task=batch + 1).close()
            entry = table_store.save(tmp_path, batch, two, entry)
        assert entry is not None and entry["chain"] == [0, 1, 2]
        resumed = RowServers(SPECS, secret=b"k", host="127.0.0.1", shards=shards)  # not started
        assert table_store.restore(tmp_path, resumed, entry) == 3
        assert resumed.now == two.now
        for t in range(len(SPECS)):
            a, b = two.table_rows(t), resumed.table_rows(t)
            for field in a:
                assert np.array_equal(a[field], b[field]), (SPECS[t].name, field)
