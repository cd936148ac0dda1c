"""Offset planning and range merging: pure functions, no Spark or Kafka."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.ingest.offsets import OffsetRange, cap_offsets, merge_ranges, plan, split_ranges

_parts = st.dictionaries(
    st.sampled_from(["0", "1", "2", "3"]),
    st.tuples(st.integers(0, 500), st.integers(0, 500)),
    min_size=1,
)


def _offsets(parts: dict[str, tuple[int, int]]) -> tuple[dict, dict]:  # type: ignore[type-arg]
    start = {"t": {p: min(a, b) for p, (a, b) in parts.items()}}
    end = {"t": {p: max(a, b) for p, (a, b) in parts.items()}}
    return start, end


def test_a_partition_missing_from_the_start_is_read_from_zero() -> None:
    assert plan({"t": {"0": 4}}, {"t": {"0": 9, "1": 3}, "u": {"0": 2}}) == [
        OffsetRange("t", 0, 4, 9),
        OffsetRange("t", 1, 0, 3),
        OffsetRange("u", 0, 0, 2),
    ]


def test_empty_ranges_are_dropped_and_nothing_is_split_below_two_records() -> None:
    assert plan({"t": {"0": 5}}, {"t": {"0": 5}}, min_partitions=4) == []
    assert split_ranges([OffsetRange("t", 0, 0, 1)], 3) == [OffsetRange("t", 0, 0, 1)]


@settings(max_examples=200, deadline=None)
@given(_parts, st.integers(0, 12))
def test_a_plan_covers_each_partition_exactly_and_merges_back(parts, min_partitions) -> None:  # type: ignore[no-untyped-def]
    start, end = _offsets(parts)
    ranges = plan(start, end, min_partitions=min_partitions)
    whole = plan(start, end)
    total = sum(end["t"][p] - start["t"][p] for p in parts)
    assert sum(r.count for r in ranges) == total and all(r.count > 0 for r in ranges)
    # As many tasks as asked, unless the records run out first.
    assert len(ranges) >= min(min_partitions, total)
    assert merge_ranges(ranges) == whole
    assert (
        merge_ranges(list(reversed(ranges))) == whole
    )  # the order tasks finish in does not matter


@settings(max_examples=200, deadline=None)
@given(_parts, st.integers(1, 2000))
def test_a_cap_takes_at_most_max_rows_and_never_goes_back(parts, max_rows) -> None:  # type: ignore[no-untyped-def]
    start, end = _offsets(parts)
    capped = cap_offsets(start, end, max_rows)
    pending = sum(end["t"][p] - start["t"][p] for p in parts)
    taken = sum(capped["t"][p] - start["t"][p] for p in parts)
    assert taken == min(pending, max_rows)
    assert all(start["t"][p] <= capped["t"][p] <= end["t"][p] for p in parts)


def test_merging_keeps_gaps_and_partitions_apart() -> None:
    ranges = [OffsetRange("t", 0, 0, 5), OffsetRange("t", 0, 6, 9), OffsetRange("t", 1, 5, 9)]
    assert merge_ranges(ranges) == ranges


def test_the_driver_plans_each_batch_from_spark_s_offset_log_reading_each_entry_once(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    from pipeline import codec
    from pipeline.ingest import tasks
    from pipeline.ingest.microbatch import Handler

    log = tmp_path / "offsets"
    log.mkdir()
    for batch, end in ((0, {"t": {"0": 10, "1": 4}}), (1, {"t": {"0": 30, "1": 4}})):
        (log / str(batch)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{json.dumps(end)}\n')
    reads: list[int] = []
    read = tasks.logged_offsets
    monkeypatch.setattr(
        tasks, "logged_offsets", lambda folder, batch: reads.append(batch) or read(folder, batch)
    )
    planner = tasks.BatchTasks(
        None,
        bootstrap="",
        schema=codec.HIGGS,
        handler=Handler(),
        checkpoint=str(tmp_path),
        python_source=True,
        min_partitions=3,
        dead_letter_topic="",
    )
    assert planner.plan(0) == [
        OffsetRange("t", 0, 0, 5),
        OffsetRange("t", 0, 5, 10),
        OffsetRange("t", 1, 0, 4),
    ]
    assert planner.plan(1) == [
        OffsetRange("t", 0, 10, 15),
        OffsetRange("t", 0, 15, 20),
        OffsetRange("t", 0, 20, 30),
    ]
    assert reads == [0, -1, 1]  # batch 1 starts where batch 0 ended, as read for batch 0
    jvm = tasks.BatchTasks(
        None,
        bootstrap="",
        schema=codec.HIGGS,
        handler=Handler(),
        checkpoint=str(tmp_path),
        python_source=False,
        min_partitions=2,
        dead_letter_topic="",
    ).plan(1)
    # Spark's own source plans from the same log: its ledger chains over markers and aborted
    # records, which its DataFrame's offsets leave out.
    assert jvm is not None and [(r.partition, r.start, r.end) for r in jvm][0][1] == 10
    assert sum(r.end - r.start for r in jvm) == 20
