"""Benchmark: Kafka -> Spark micro-batches -> decoded numpy on the executors, against a bare
kafka-python consume of the same records in the same run.

The stream arm runs the real StreamJob (Python Kafka source, local[2], availableNow,
20,000-record micro-batches, a handler that only counts); its rate is records over
the wall time from the first batch's start to the last batch's end, so trigger
gaps count. The baseline assigns a kafka-python consumer to every partition and
reads the same records once. Spark's start-up is excluded from both. A third arm streams
the MNIST records from a zstd-compressed copy of the topic (what many producers write):
``zstd_ratio`` is its rate over the uncompressed topic's, in the same run (target >= 0.7:
inflating must not become the bottleneck). A fourth reads the MNIST topic of one broker
twice, through its PLAINTEXT listener and through its SASL_SSL listener with SCRAM-SHA-512
(tests/ingest/secure_kafka.py: Apache Kafka's own broker): ``tls_ratio`` is the secured
rate over the plaintext one, in the same run (target >= 0.8: TLS and SASL must not cost
the stream a fifth of its speed). A fifth reads the MNIST topic through Spark's own Kafka
source (spark-sql-kafka, its jars from the cache) into the same numpy blocks:
``jvm_vs_python`` is its decoded records/s over the Python source's, the median of three
alternated pairs in the same run. The broker is Apache Kafka's own (``--engine kafka``):
Spark's source reads short of the end on Tansu.

    .venv/bin/python bench/source.py [--records 60000]

Last line: ``source mnist_rps=<n> higgs_rps=<n> ratio_vs_consumer=<r> trigger_overhead_ms_p50=<n>
zstd_ratio=<r> tls_ratio=<r> jvm_vs_python=<r>``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kafka import TopicPartition

sys.path.insert(
    0, str(Path(__file__).resolve().parent.parent)
)  # the secured endpoint is the tests' own
from pipeline import cluster, codec  # noqa: E402
from pipeline.ingest import microbatch as stream  # noqa: E402
from pipeline.ingest.kafka import EmbeddedBroker, client  # noqa: E402
from producers import Replay, datasets  # noqa: E402
from tests.ingest.secure_kafka import SecureKafka  # noqa: E402


class Count(stream.Handler):
    def process(self, block: stream.Block) -> dict[str, Any]:
        return {"n": len(block.y), "pixels": int(block.x.shape[1])}


def bare_consume(bootstrap: str, topic: str, n: int) -> float:
    c = client.consumer(
        bootstrap,
        max_partition_fetch_bytes=16 << 20,
        fetch_max_bytes=64 << 20,
        receive_buffer_bytes=4 << 20,
    )
    tps = [TopicPartition(topic, p) for p in client.partitions_for(c, topic)]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    got = 0
    started = time.perf_counter()
    while got < n:
        for records in c.poll(timeout_ms=500, max_records=100_000).values():
            got += len(records)
    elapsed = time.perf_counter() - started
    c.close()
    return got / elapsed


def stream_arm(
    spark: Any,
    bootstrap: str,
    topic: str,
    schema: codec.Schema,
    n: int,
    per_batch: int,
    handler: stream.Handler | None = None,
    kafka_conf: str | None = None,
    source: str = "python",
) -> tuple[float, list[float]]:
    """Records/s of one topic through the StreamJob, and each batch's trigger-to-handler ms.
    ``handler``: one the executors can unpickle (a script importing this module passes its
    own, defined in its ``__main__``); default :class:`Count`. ``kafka_conf``: a client
    properties file (TLS, SASL). ``source``: the Kafka source, ``python`` or ``jvm``."""
    with tempfile.TemporaryDirectory() as ckpt:
        job = stream.StreamJob(
            spark,
            bootstrap=bootstrap,
            topics=[topic],
            schema=schema,
            handler=handler or Count(),
            checkpoint=ckpt,
            source=source,
            available_now=True,
            max_offsets_per_trigger=per_batch,
            dead_letter_topic="",
            kafka_conf=kafka_conf,
        )
        marks: list[float] = []
        original = job._on_batch

        def timed(df: Any, batch_id: int) -> None:
            marks.append(time.perf_counter())
            original(df, batch_id)
            marks.append(time.perf_counter())

        job._on_batch = timed  # type: ignore[method-assign]
        batches = job.run(timeout_s=600)
    rows = sum(b.rows for b in batches)
    assert rows == n and all(b.accepted == b.rows for b in batches), (rows, n)
    overhead = [
        b.trigger_to_handler_s * 1000 for b in batches if b.trigger_to_handler_s is not None
    ]
    return rows / (marks[-1] - marks[0]), overhead


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--per-batch", type=int, default=20_000)
    args = ap.parse_args()
    n = args.records
    with (
        EmbeddedBroker(engine="kafka") as broker,
        tempfile.TemporaryDirectory() as tls_dir,
        SecureKafka(tls_dir, mode="sasl_ssl", mechanisms=("SCRAM-SHA-512",)) as secured,
    ):
        sets = {"mnist": datasets.get("mnist"), "higgs": datasets.get("higgs")}
        for name, data in sets.items():
            Replay(
                data, bootstrap=broker.bootstrap, topic=name, partitions=2, loop=True, limit=n
            ).run()
        Replay(
            sets["mnist"],
            bootstrap=broker.bootstrap,
            topic="mnist-zstd",
            partitions=2,
            loop=True,
            limit=n,
            producer_config={"compression_type": "zstd"},
        ).run()
        Replay(
            sets["mnist"],
            bootstrap=secured.plain_bootstrap,
            topic="mnist",
            partitions=2,
            loop=True,
            limit=n,
        ).run()
        secured_conf = str(secured.write_client_properties())
        spark = cluster.session("local[2]", app="bench-source", source="jvm")
        try:
            # Warm-up: Python workers start and import their modules once per session.
            stream_arm(spark, broker.bootstrap, "higgs", codec.HIGGS, n, args.per_batch)
            results = {}
            overheads: list[float] = []
            for name, data in sets.items():
                rps, overhead = stream_arm(
                    spark, broker.bootstrap, name, data.schema, n, args.per_batch
                )
                bare = bare_consume(broker.bootstrap, name, n)
                results[name] = (rps, bare)
                overheads += overhead
                print(
                    f"{name}: stream {rps:,.0f} records/s decoded on executors; bare kafka-python "
                    f"consume {bare:,.0f} records/s; ratio {rps / bare:.2f}; trigger->handler ms "
                    f"{[round(o) for o in overhead]}",
                    flush=True,
                )
            zstd_rps, _ = stream_arm(
                spark, broker.bootstrap, "mnist-zstd", sets["mnist"].schema, n, args.per_batch
            )
            print(
                f"mnist zstd: stream {zstd_rps:,.0f} records/s decoded on executors; "
                f"{zstd_rps / results['mnist'][0]:.2f} of the uncompressed topic's",
                flush=True,
            )
            # The same records of one broker, PLAINTEXT then SASL_SSL, alternated five times: the
            # median ratio (one arm is about a second, so one pair swings with the machine).
            tls = []
            for _ in range(5):
                plain_rps, _ = stream_arm(
                    spark, secured.plain_bootstrap, "mnist", sets["mnist"].schema, n, args.per_batch
                )
                tls_rps, _ = stream_arm(
                    spark,
                    secured.bootstrap,
                    "mnist",
                    sets["mnist"].schema,
                    n,
                    args.per_batch,
                    kafka_conf=secured_conf,
                )
                tls.append(tls_rps / plain_rps)
                print(
                    f"mnist SASL_SSL: stream {tls_rps:,.0f} records/s against {plain_rps:,.0f} "
                    f"over PLAINTEXT from the same broker; ratio {tls[-1]:.2f}",
                    flush=True,
                )
            # Spark's own source against the Python one, on the same topic: warmed up once
            # (its classes load on the first query), then three alternated pairs.
            mnist = sets["mnist"].schema
            stream_arm(spark, broker.bootstrap, "mnist", mnist, n, args.per_batch, source="jvm")
            jvm = []
            for _ in range(3):
                py_rps, _ = stream_arm(spark, broker.bootstrap, "mnist", mnist, n, args.per_batch)
                jvm_rps, _ = stream_arm(
                    spark, broker.bootstrap, "mnist", mnist, n, args.per_batch, source="jvm"
                )
                jvm.append(jvm_rps / py_rps)
                print(
                    f"mnist through Spark's own source: {jvm_rps:,.0f} records/s decoded on "
                    f"executors against {py_rps:,.0f} through the Python source; ratio "
                    f"{jvm[-1]:.2f}",
                    flush=True,
                )
        finally:
            cluster.stop(spark)
    ratio = statistics.median(r / b for r, b in results.values())
    print(
        f"source mnist_rps={results['mnist'][0]:.0f} higgs_rps={results['higgs'][0]:.0f} "
        f"ratio_vs_consumer={ratio:.2f} trigger_overhead_ms_p50={statistics.median(overheads):.0f} "
        f"zstd_ratio={zstd_rps / results['mnist'][0]:.2f} tls_ratio={statistics.median(tls):.2f} "
        f"jvm_vs_python={statistics.median(jvm):.2f}"
    )


if __name__ == "__main__":
    main()
