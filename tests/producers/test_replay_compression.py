"""`streamtrain produce --compression`: the replay writes batches in Kafka's codecs, and the
Fetch reader and kafka-python's consumer read every record back."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka import TopicPartition

from pipeline.ingest.kafka import client
from pipeline.ingest.kafka.fetch import RangeReader

ROOT = Path(__file__).resolve().parents[2]
CODEC_IDS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


def _codecs_of_batches(records: memoryview) -> set[int]:
    """The codec ids in the attributes of each record batch of a Fetch response."""
    data, pos, found = bytes(records), 0, set()
    while pos + 61 <= len(data):
        length = struct.unpack_from(">i", data, pos + 8)[0]
        found.add(struct.unpack_from(">h", data, pos + 21)[0] & 0x07)
        pos += 12 + length
    return found


@pytest.mark.parametrize("codec", ["zstd", "snappy"])
def test_produce_compresses_with_the_codec_asked_for(broker, topic, data_dir, codec) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "produce",
            "higgs",
            "--topic",
            topic,
            "--limit",
            "500",
            "--partitions",
            "1",
            "--compression",
            codec,
            "--bootstrap",
            broker.bootstrap,
            "--data-dir",
            str(data_dir),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reader = RangeReader(broker.bootstrap, timeout_s=10)
    fetched = reader._fetch(topic, 0, 0, 1 << 20).records
    # kafka-python sends a batch uncompressed when the codec would not shrink it (a batch of
    # one or two records cut short by the linger, in zstd's frame overhead): codec 0 may show.
    assert fetched is not None
    codecs = _codecs_of_batches(fetched)
    assert CODEC_IDS[codec] in codecs and codecs <= {0, CODEC_IDS[codec]}
    assert sum(len(r) for r in reader.read(topic, 0, 0, 500)) == 500
    reader.close()
    c = client.consumer(broker.bootstrap)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek(tp, 0)
    got, deadline = 0, time.monotonic() + 30
    while got < 500 and time.monotonic() < deadline:
        got += len(c.poll(timeout_ms=200).get(tp, []))
    c.close()
    assert got == 500
