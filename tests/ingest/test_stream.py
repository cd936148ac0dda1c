"""Kafka -> Spark Structured Streaming -> decoded blocks, against the real broker and Spark."""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kafka import KafkaProducer

from pipeline import codec
from pipeline.ingest import microbatch as stream
from pipeline.ingest import sources as source
from pipeline.ingest.batch_figures import BatchFigures
from pipeline.ingest.kafka import client
from pipeline.ingest.offsets import OffsetRange
from pipeline.ingest.sizing import Sizing
from producers import Replay, datasets
from tests.conftest import SOURCES
from tests.ingest import stream_helpers

# A Spark session's streaming queries against the broker: the full tier's (the quick tier's
# budget is four minutes; these take a minute together).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def _ship_helpers() -> None:
    stream_helpers.register()


@pytest.fixture(scope="module")
def higgs(data_dir):  # type: ignore[no-untyped-def]
    return datasets.get("higgs", data_dir=data_dir)


def _replay(broker, topic: str, data, *, limit: int | None = None, split: str = "train") -> int:  # type: ignore[no-untyped-def]
    report = Replay(
        data, bootstrap=broker.bootstrap, topic=topic, partitions=3, limit=limit, split=split
    ).run()
    assert report.send_errors == 0
    return report.records_sent


def _job(spark, broker, topic: str, checkpoint: Path, source: str = "python", **kwargs):  # type: ignore[no-untyped-def]
    return stream.StreamJob(
        spark,
        bootstrap=broker.bootstrap,
        topics=[topic],
        schema=codec.HIGGS,
        handler=stream_helpers.Recording(),
        checkpoint=checkpoint,
        source=source,
        **kwargs,
    )


def _wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _ids(batches: list[BatchFigures]) -> list[int]:
    return [i for b in batches for r in b.results for i in r["ids"]]


def _assert_contiguous(batches: list[BatchFigures]) -> dict[tuple[str, int], int]:
    """Each partition's ranges follow one another with no gap and no overlap; returns the ends."""
    ends: dict[tuple[str, int], int] = {}
    for b in batches:
        for r in b.ranges:
            t, p, start, end = r.topic, r.partition, r.start, r.end
            assert start == ends.get((t, p), 0), (
                f"batch {b.batch_id}: {t}-{p} starts at {start}, not {ends.get((t, p), 0)}"
            )
            assert end > start
            ends[(t, p)] = end
    return ends


@pytest.mark.slow
@pytest.mark.parametrize("kind", SOURCES)
def test_every_record_exactly_once_across_runs(spark, broker, topic, tmp_path, higgs, kind) -> None:  # type: ignore[no-untyped-def]
    checkpoint = tmp_path / "ckpt"
    produced = _replay(broker, topic, higgs, limit=2500)  # before the first run
    job = _job(spark, broker, topic, checkpoint, kind, max_offsets_per_trigger=1000)

    def during() -> None:
        # More records arrive while the query runs: once it has handled a first batch.
        _wait_until(lambda: bool(job.batches), 60, "a first batch")
        Replay(higgs, bootstrap=broker.bootstrap, topic=topic, split="test", partitions=3).run()

    feeder = threading.Thread(target=during)
    feeder.start()
    first = job.run(timeout_s=15)
    feeder.join()
    produced += 500
    produced += _replay(broker, topic, higgs, limit=700)  # between runs
    second = _job(spark, broker, topic, checkpoint, kind, max_offsets_per_trigger=1000).run(
        timeout_s=60, max_batches=1
    )
    batches = first + second
    assert [b.batch_id for b in batches] == list(range(len(batches)))
    assert all(b.rows <= 1000 for b in batches)
    ends = _assert_contiguous(batches)
    assert sum(ends.values()) == produced == sum(b.rows for b in batches)
    # Every record once: offsets per partition, and (id, split) pairs as produced.
    offsets = Counter((r["partition"], o) for b in batches for r in b.results for o in r["offsets"])
    assert len(offsets) == produced and set(offsets.values()) == {1}
    ids = Counter(_ids(batches))
    assert ids == Counter([*range(2500), *range(500), *range(700)])


@pytest.mark.parametrize("kind", SOURCES)
def test_available_now_drains_and_stops(spark, broker, topic, tmp_path, higgs, kind) -> None:  # type: ignore[no-untyped-def]
    produced = _replay(broker, topic, higgs, limit=3500)
    batches = _job(
        spark,
        broker,
        topic,
        tmp_path / "ckpt",
        kind,
        available_now=True,
        max_offsets_per_trigger=1000,
    ).run(timeout_s=120)
    if kind == "python":
        assert [b.rows for b in batches] == [1000, 1000, 1000, 500]
    else:  # Spark's splits the cap between partitions by their share, each rounded down
        assert all(990 <= b.rows <= 1000 for b in batches[:3]), [b.rows for b in batches]
    assert sum(_assert_contiguous(batches).values()) == produced


@pytest.mark.parametrize("kind", SOURCES)
def test_a_session_in_another_time_zone_reads_the_same_instants(
    spark, broker, topic, tmp_path, higgs, kind
) -> None:  # type: ignore[no-untyped-def]
    """mapInArrow labels timestamps with the session's zone (a user's may be any): every
    batch of Spark's own source failed on it in decode, and the instants must not move."""
    produced = _replay(broker, topic, higgs, limit=300)
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        batches = _job(spark, broker, topic, tmp_path / "ckpt", kind, available_now=True).run(
            timeout_s=120
        )
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)
    assert sorted(_ids(batches)) == list(range(produced))
    newest = max(ms for b in batches for ms in b.newest_ms.values())
    assert abs(newest - time.time() * 1000) < 300_000  # Kafka's CreateTime, not hours off


def test_no_batch_starts_before_prepare_returns(spark, broker, topic, tmp_path, higgs) -> None:  # type: ignore[no-untyped-def]
    produced = _replay(broker, topic, higgs, limit=800)
    ready: list[float] = []
    checkpoint = tmp_path / "ckpt"

    def prepare() -> None:
        # Return only once the query has planned its first batch: it waits for us.
        _wait_until(lambda: (checkpoint / "offsets" / "0").is_file(), 60, "batch 0 planned")
        ready.append(time.monotonic())

    [batch] = _job(spark, broker, topic, checkpoint).run(
        max_batches=1, timeout_s=60, prepare=prepare
    )
    assert batch.rows == produced and batch.started_at >= ready[0]


def test_a_failing_prepare_stops_the_query_and_commits_nothing(
    spark, broker, topic, tmp_path, higgs
) -> None:  # type: ignore[no-untyped-def]
    produced = _replay(broker, topic, higgs, limit=800)

    def prepare() -> None:
        _wait_until(lambda: (tmp_path / "ckpt" / "offsets" / "0").is_file(), 60, "batch 0 planned")
        raise RuntimeError("the warm-up failed")

    job = _job(spark, broker, topic, tmp_path / "ckpt")
    with pytest.raises(RuntimeError, match="the warm-up failed"):
        job.run(timeout_s=60, prepare=prepare)
    assert not job.batches and not list((tmp_path / "ckpt" / "commits").glob("[0-9]*"))
    # The next run trains from the start: nothing was lost.
    [batch] = _job(spark, broker, topic, tmp_path / "ckpt").run(max_batches=1, timeout_s=60)
    assert batch.batch_id == 0 and batch.rows == produced


def test_figures_per_batch(spark, broker, topic, tmp_path, higgs) -> None:  # type: ignore[no-untyped-def]
    produced = _replay(broker, topic, higgs, limit=1200)
    [batch] = _job(spark, broker, topic, tmp_path / "ckpt", min_partitions=6).run(
        max_batches=1, timeout_s=60
    )
    assert (
        batch.rows == batch.accepted == produced
        and batch.bytes == produced * codec.HIGGS.record_bytes
    )
    # Split into 6 tasks for parallelism, reported as one range per Kafka partition.
    assert len(batch.results) == 6 and len(batch.ranges) == 3
    assert batch.decode_s > 0 and batch.handler_s >= 0 and batch.trigger_to_handler_s is not None
    labels = [y for r in batch.results for y in r["labels"]]
    assert sorted(labels) == sorted(higgs.load().y[:produced].tolist())


def test_malformed_records_go_to_the_dead_letter_topic(
    spark, broker, topic, tmp_path, higgs, consume
) -> None:  # type: ignore[no-untyped-def]
    good = higgs.load("test")
    values = codec.encode(good.x[:10], good.y[:10], codec.HIGGS)
    nan = codec.encode(np.full((1, 28), np.nan, np.float32), np.array([1]), codec.HIGGS)[0]
    label = codec.encode(good.x[:1], np.array([7]), codec.HIGGS)[0]
    bad = [
        b"junk",
        nan,
        label,
        values[0][:-4],
        codec.encode(np.zeros((1, 784), np.uint8), np.array([1]), codec.MNIST)[0],
    ]
    client.ensure_topic(broker.bootstrap, topic, partitions=1)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for v in values[:5] + bad + values[5:]:
        p.send(topic, v, key=b"k", partition=0)
    p.flush()
    [batch] = _job(spark, broker, topic, tmp_path / "ckpt").run(max_batches=1, timeout_s=60)
    assert batch.rows == 15 and batch.accepted == 10
    assert batch.rejects == {"wrong_length": 3, "non_finite": 1, "label_out_of_range": 1}
    assert sum(len(r["labels"]) for r in batch.results) == 10  # rejects never reach the handler
    dead = consume(f"{topic}.dlq", 5)
    assert [r.value for r in dead] == bad
    reasons = [dict(r.headers)["streamtrain.reason"].decode() for r in dead]
    assert reasons == [
        "wrong_length",
        "non_finite",
        "label_out_of_range",
        "wrong_length",
        "wrong_length",
    ]
    assert [int(dict(r.headers)["streamtrain.offset"]) for r in dead] == [5, 6, 7, 8, 9]


@pytest.mark.slow
def test_restart_after_sigkill_mid_batch_replays_the_same_batch(
    spark, broker, topic, tmp_path, higgs
) -> None:  # type: ignore[no-untyped-def]
    produced = _replay(broker, topic, higgs, limit=3000)
    checkpoint, ledger = tmp_path / "ckpt", tmp_path / "ledger.jsonl"
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.ingest.stream_helpers",
            broker.bootstrap,
            topic,
            str(checkpoint),
            str(ledger),
            "1",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        lines = ledger.read_text().splitlines() if ledger.exists() else []
        if any(json.loads(line)["batch_id"] == 1 for line in lines):
            break
        time.sleep(0.2)
    assert child.poll() is None, child.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
    child.send_signal(signal.SIGKILL)
    child.wait()
    before = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [b["batch_id"] for b in before] == [0, 1]

    # Resumed with batches sized for a freshness target, at most 200 records: the killed batch
    # comes back with the same id and the same 1,000 offsets (Spark's log, never sized again);
    # the batches after it are sized; nothing is skipped.
    sized = Sizing(target_s=2.0, min_rows=100, max_rows=200)
    after = _job(spark, broker, topic, checkpoint, sizing=sized).run(max_batches=6, timeout_s=120)
    assert after[0].batch_id == 1
    assert [list(dataclasses.astuple(r)) for r in after[0].ranges] == before[1]["ranges"]
    assert after[0].rows == 1000 and all(b.rows <= 200 for b in after[1:]), [b.rows for b in after]
    ranges = [OffsetRange(*r) for r in before[0]["ranges"]]
    all_batches = [BatchFigures(0, ranges, rows=before[0]["rows"]), *after]
    assert sum(_assert_contiguous(all_batches).values()) == produced


def test_both_sources_give_the_same_columns_and_auto_says_which(
    spark, broker, topic, tmp_path, caplog
) -> None:  # type: ignore[no-untyped-def]
    client.ensure_topic(broker.bootstrap, topic, partitions=1)
    with caplog.at_level(logging.INFO, logger="pipeline.ingest.sources"):
        df = source.read_stream(spark, bootstrap=broker.bootstrap, topics=[topic], source="auto")
    assert tuple(df.columns) == source.COLUMNS
    assert [f.dataType.simpleString() for f in df.schema.fields] == [
        "binary",
        "binary",
        "string",
        "int",
        "bigint",
        "timestamp",
    ]
    # auto reads with the faster of the two, measured (bench/source.py): the Python source.
    assert "Python source (auto: the faster, measured)" in caplog.text
    assert source.jvm_available(spark)  # the session fixture puts Spark's own on spark.jars
    jvm = source.read_stream(spark, bootstrap=broker.bootstrap, topics=[topic], source="jvm")
    assert jvm.schema == df.schema


def test_an_unreadable_batch_stops_the_stream_with_its_line_counted_and_as_lag(
    spark,
    raw_broker,
    topic,  # type: ignore[no-untyped-def]
    tmp_path,
) -> None:
    """A batch the reader cannot read ends the run with its one line (not 'Kafka unavailable',
    not a clean stop), calls on_unreadable, and its records count as lag."""
    from pipeline.errors import StreamtrainError
    from tests.ingest.test_fetch import _unreadable_topic

    broker = raw_broker  # Apache Kafka refuses a corrupt batch (test_fetch)
    _unreadable_topic(broker.bootstrap, topic)
    seen: list[Any] = []
    job = _job(
        spark,
        broker,
        topic,
        tmp_path / "ckpt",
        available_now=True,
        on_unreadable=lambda error, lag: seen.append((error, lag)),
    )
    with pytest.raises(
        StreamtrainError, match=rf"^Cannot read {topic}-0 at offset 3: Cannot inflate a zstd batch"
    ):
        job.run(timeout_s=120)
    assert [(e.topic, e.partition, e.offset, lag) for e, lag in seen] == [
        (topic, 0, 3, {(topic, 0): 6})
    ]
    assert not job.batches  # nothing handled: nothing trained, nothing committed


def test_a_stop_asked_for_mid_batch_waits_for_that_batch_s_commit(
    spark, broker, topic, tmp_path, higgs
) -> None:  # type: ignore[no-untyped-def]
    """Proves: a stop that comes while a batch runs (a deadline, a signal) lets that batch
    finish and waits until Spark has committed it, so a restart does not replay it."""
    _replay(broker, topic, higgs, limit=400)
    entered, asked = threading.Event(), threading.Event()

    class SlowBatch(stream_helpers.Recording):
        def on_batch(self, info: BatchFigures) -> None:
            entered.set()
            assert asked.wait(30), "the stop was not asked for within 30 s"
            super().on_batch(info)

    def until() -> bool:  # true once the first batch runs: the stop comes mid-batch
        if entered.is_set():
            asked.set()
            return True
        return False

    job = _job(spark, broker, topic, tmp_path / "ckpt")
    job.handler = SlowBatch()  # the driver's half only: its events do not pickle to executors
    [batch] = job.run(timeout_s=60, until=until)
    assert batch.batch_id == 0 and (tmp_path / "ckpt" / "commits" / "0").is_file()
