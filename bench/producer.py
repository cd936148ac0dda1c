"""Benchmark: replay producer vs a bare kafka-python send loop of the same bytes, same run.

Both arms send the same encoded records, keys and partitions into the embedded
broker at full speed, alternating, three rounds each; medians are reported.

    .venv/bin/python bench/producer.py [--rounds 3] [--bootstrap HOST:PORT]

Last line: ``producer mnist_rps=<n> higgs_rps=<n> ratio_vs_client=<r>``
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import uuid

import numpy as np
from kafka import KafkaProducer

from pipeline import codec, record_key
from pipeline.ingest.kafka import EmbeddedBroker, client
from producers import Replay, datasets
from producers.replay import PRODUCER_DEFAULTS


def bare_loop(bootstrap: str, data: datasets.Dataset, n: int, partitions: int) -> float:
    """records/s of a plain KafkaProducer.send loop over pre-encoded records."""
    chunk = data.load("train")
    reps = -(-n // len(chunk.y))
    values = codec.encode(chunk.x, chunk.y, data.schema) * reps
    keys = record_key.encode_keys(chunk.ids) * reps
    parts = (chunk.ids % np.uint64(partitions)).astype(int).tolist() * reps
    topic = f"bare-{uuid.uuid4().hex[:8]}"
    client.ensure_topic(bootstrap, topic, partitions=partitions)
    producer = KafkaProducer(bootstrap_servers=bootstrap, **PRODUCER_DEFAULTS)
    send = producer.send
    started = time.perf_counter()
    for i in range(n):
        send(topic, values[i], keys[i], None, parts[i])
    producer.flush()
    elapsed = time.perf_counter() - started
    producer.close()
    return n / elapsed


def replay(bootstrap: str, data: datasets.Dataset, n: int, partitions: int) -> tuple[float, float]:
    """(records/s, MB/s) of the replay producer, acknowledged records only."""
    report = Replay(
        data,
        bootstrap=bootstrap,
        topic=f"replay-{uuid.uuid4().hex[:8]}",
        loop=True,
        limit=n,
        partitions=partitions,
    ).run()
    assert report.records_sent == n and report.send_errors == 0, report.summary()
    return report.records_per_s, report.mb_per_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--bootstrap", help="a running Kafka instead of the embedded broker")
    args = ap.parse_args()

    sets = {"mnist": datasets.get("mnist"), "higgs": datasets.get("higgs")}
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap or stack.enter_context(EmbeddedBroker()).bootstrap
        results: dict[str, dict[str, list[float]]] = {
            k: {"replay": [], "mbps": [], "bare": []} for k in sets
        }
        for r in range(args.rounds):
            for name, data in sets.items():
                rps, mbps = replay(bootstrap, data, args.records, args.partitions)
                bare = bare_loop(bootstrap, data, args.records, args.partitions)
                results[name]["replay"].append(rps)
                results[name]["mbps"].append(mbps)
                results[name]["bare"].append(bare)
                print(
                    f"round {r + 1} {name}: replay {rps:,.0f} rec/s ({mbps:.1f} MB/s), bare loop "
                    f"{bare:,.0f} rec/s",
                    flush=True,
                )
    med = {k: {arm: statistics.median(v) for arm, v in arms.items()} for k, arms in results.items()}
    for name, m in med.items():
        print(
            f"{name}: replay {m['replay']:,.0f} rec/s {m['mbps']:.1f} MB/s; bare kafka-python "
            f"{m['bare']:,.0f} rec/s; ratio {m['replay'] / m['bare']:.2f}"
        )
    ratio = statistics.median(med[k]["replay"] / med[k]["bare"] for k in med)
    print(
        f"producer mnist_rps={med['mnist']['replay']:.0f} higgs_rps={med['higgs']['replay']:.0f} "
        f"ratio_vs_client={ratio:.2f}"
    )


if __name__ == "__main__":
    main()
