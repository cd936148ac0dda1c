"""The model's freshness from records with known Kafka timestamps: CreateTime and
LogAppendTime record batches, parsed as the reader parses them, decoded as a task decodes
them, gathered per partition, learned by the exactly-once driver, kept by its checkpoint and
read back by a model server's weights."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline import codec, record_key
from pipeline.ingest import microbatch, reader
from pipeline.ingest.batch_figures import BatchFigures
from pipeline.ingest.decode import decode_range
from pipeline.ingest.kafka.record_batch import parse_batches
from pipeline.ingest.offsets import OffsetRange
from pipeline.jobs.run_metrics import RunMetrics
from pipeline.serve.weights import CheckpointWeights
from pipeline.train import checkpoint
from pipeline.train.driver import TrainDriver
from pipeline.train.freshness import Freshness
from pipeline.train.ps import ParameterServer
from tests.ingest import raw_batches

T0 = 1_700_000_000_000  # ms: a fixed moment, so every figure below is exact


def _sample(run: RunMetrics, name: str) -> float:
    value = run.meters.registry.get_sample_value(name)
    assert value is not None, name
    return value


def _task(partition: int, start: int, deltas_ms: list[int], *, log_append_ms: int | None = None):  # type: ignore[no-untyped-def]
    """A task's figures for records ``start..`` of ``partition`` with timestamps
    ``T0 + deltas_ms`` (CreateTime), or all ``log_append_ms`` (the broker's LogAppendTime)."""
    n = len(deltas_ms)
    rng = np.random.default_rng(partition)
    values = codec.encode(
        rng.integers(0, 256, (n, 784), dtype=np.uint8), rng.integers(0, 10, n), codec.MNIST
    )
    keys = record_key.encode_keys(np.arange(start, start + n, dtype=np.uint64))
    raw = raw_batches.batch(
        list(zip(keys, values, strict=True)),
        base_offset=start,
        first_ms=T0,
        deltas_ms=deltas_ms,
        attributes=0x08 if log_append_ms is not None else 0,
        max_ms=log_append_ms,
    )
    found, _ = parse_batches(raw, start=start, end=start + n)
    planned = OffsetRange("t", partition, start, start + n)
    return decode_range(
        iter([reader._arrow(found[0], planned)]),
        schema=codec.MNIST,
        handler=microbatch.Handler(),
        planned=planned,
        dead_letter=None,
    )


def test_create_and_log_append_times_reach_the_task_and_bound_the_model_per_partition() -> None:
    """Proves: a task reports the newest CreateTime of its range (not the last record's),
    and LogAppendTime where the batch says so; the batch keeps the newest per partition
    (two tasks of one partition); the model's freshness is now minus the oldest partition's,
    and a quiet partition (nothing in the batch, nothing left) bounds nothing while another
    lags; one that had records in the batch does, its lag 0 or not."""
    first = _task(0, 0, [0, 1500, 700, 900])  # newest 1.5 s after T0, though not the last record
    second = _task(0, 4, [2000, 2100])
    appended = _task(
        1, 0, [0, 5, 9], log_append_ms=T0 + 1200
    )  # the broker's time, not the producer's
    assert (first.newest_ms, second.newest_ms, appended.newest_ms) == (
        T0 + 1500,
        T0 + 2100,
        T0 + 1200,
    )
    assert first.accepted == 4 and appended.accepted == 3  # the records decoded as well

    info = BatchFigures.gather(0, [first, second, appended], started_at=0.0)
    assert info.newest_ms == {("t", 0): T0 + 2100, ("t", 1): T0 + 1200}
    fresh = Freshness()
    fresh.learn(info.newest_ms, lag={("t", 0): 10, ("t", 1): 10})
    assert fresh.seconds(now=T0 / 1000 + 4.0) == pytest.approx(
        2.8
    )  # partition 1 bounds it: 4.0 - 1.2
    read_late = Freshness()
    read_late.learn(
        info.newest_ms, lag={("t", 0): 10, ("t", 1): 0}
    )  # its lag of 0 may be a second old
    assert read_late.as_of == pytest.approx(T0 / 1000 + 1.2)
    fresh.learn(
        {}, lag={("t", 0): 10, ("t", 1): 0}
    )  # partition 1 went quiet: partition 0 bounds it
    assert fresh.seconds(now=T0 / 1000 + 4.0) == pytest.approx(1.9)
    # An older batch replayed into the figures never moves a partition back.
    fresh.learn({("t", 0): T0}, lag={("t", 0): 10, ("t", 1): 0})
    assert fresh.seconds(now=T0 / 1000 + 4.0) == pytest.approx(1.9)


def test_the_driver_saves_freshness_with_the_batch_and_a_model_server_reads_it(
    tmp_path: Path,
) -> None:
    """Proves: the row of a saved batch carries the model's freshness, which /metrics reads
    live (gauge) and samples (histogram); the checkpoint keeps the bound (a resumed driver,
    a resumed run's metrics and a model server serving the folder read it back)."""
    with ParameterServer(np.zeros(4, np.float32), secret=b"s") as server:
        driver = TrainDriver(server, checkpoint.State(np.zeros(4, np.float32)), folder=tmp_path)
        rows = []
        driver.on_row = lambda info, row, weights: rows.append(row)
        now_ms = int(time.time() * 1000)
        driver.on_batch(
            BatchFigures(
                0,
                [OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 10)],
                newest_ms={("t", 0): now_ms - 3000, ("t", 1): now_ms - 1000},
                lag={("t", 0): 5, ("t", 1): 5},
            )
        )
        assert 3.0 <= rows[0].freshness_s < 4.0 and "freshness_s" in rows[0].to_dict()
        run = RunMetrics(dataset="mnist", algorithm="adag", topic="t", workers=2)
        assert math.isnan(run.freshness_s())  # nothing learned yet: a gap, not 0
        run.on_batch(BatchFigures(0, []), rows[0])
        run.on_lag({("t", 0): 5})  # the lag monitor's tick samples it
        assert 3.0 <= _sample(run, "streamtrain_model_freshness_seconds") < 5.0
        assert _sample(run, "streamtrain_model_freshness_sampled_seconds_count") == 1
        assert checkpoint.data_as_of(tmp_path) == pytest.approx(now_ms / 1000 - 3.0)
        resumed = TrainDriver(server, checkpoint.load(tmp_path), folder=tmp_path)
        assert resumed.freshness.newest_ms == {("t", 0): now_ms - 3000, ("t", 1): now_ms - 1000}
        restarted = RunMetrics(dataset="mnist", algorithm="adag", topic="t", workers=2)
        restarted.restore(checkpoint.load(tmp_path), tmp_path)  # type: ignore[arg-type]
        assert 3.0 <= _sample(restarted, "streamtrain_model_freshness_seconds") < 5.0
    served = CheckpointWeights(tmp_path)._refresh()
    assert served is not None and served.data_as_of == pytest.approx(now_ms / 1000 - 3.0)
    assert 3.0 <= (served.freshness_s() or 0) < 5.0
