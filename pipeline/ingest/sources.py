"""Kafka into Spark Structured Streaming: two interchangeable sources with the same columns
(:data:`pipeline.ingest.columns.NAMES`).

``source="jvm"`` is Spark's own ``format("kafka")`` (needs the spark-sql-kafka jar),
``source="python"`` is streamtrain's Python data source, and ``source="auto"`` takes the
faster of the two as measured on the same topic (``bench/source.py``'s ``jvm_vs_python``:
0.34, Spark's own decoded a third of the Python source's records per second into the same
numpy blocks), which is the Python source, jar or not.
"""

from __future__ import annotations

import logging
from typing import Any

from pipeline.errors import ConfigError
from pipeline.ingest import columns
from pipeline.ingest.sizing import Sizing

log = logging.getLogger(__name__)

SOURCES = ("auto", "python", "jvm")
COLUMNS = columns.NAMES


def jvm_available(spark: Any) -> bool:
    """Whether Spark's Kafka source classes are on the driver's classpath: pyspark's own
    folder, or ``spark.jars``, whose loader is the thread's context loader (where Spark
    looks up ``format("kafka")``), not the one a plain ``Class.forName`` asks."""
    jvm = spark.sparkContext._jvm
    try:
        jvm.java.lang.Class.forName(
            "org.apache.spark.sql.kafka010.KafkaSourceProvider",
            False,
            jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader(),
        )
    except Exception:  # py4j wraps ClassNotFoundException in its own error type
        return False
    return True


def choose(spark: Any, source: str, *, sized: bool = False) -> str:
    """Resolve ``auto`` to ``jvm`` or ``python``, saying which in the log; ``sized``: batches
    are sized for a freshness target, which streamtrain's Python source alone does (Spark's
    plans a fixed ``maxOffsetsPerTrigger``)."""
    if source not in SOURCES:
        raise ConfigError(f"Expected source in {SOURCES}. Received: source={source!r}")
    if sized and source == "jvm":
        raise ConfigError(
            "--freshness-target sizes batches in streamtrain's Python source; Spark's own "
            "(source=jvm) plans a fixed maxOffsetsPerTrigger. Use source=python (or auto), or "
            "drop the target."
        )
    if sized:
        log.info(
            "Kafka source: streamtrain's Python source (it sizes batches for the freshness target)"
        )
        return "python"
    if source != "auto":
        if source == "jvm" and not jvm_available(spark):
            raise ConfigError(
                "source=jvm needs the spark-sql-kafka jar on Spark's classpath; it is not there. "
                "Use source=python (or auto)."
            )
        return source
    log.info("Kafka source: streamtrain's Python source (auto: the faster, measured)")
    return "python"


def initial_offsets_path(checkpoint: str) -> str:
    """Where the Python source keeps a query's first start offsets, inside its checkpoint."""
    return f"{checkpoint.rstrip('/')}/streamtrain/initial-offsets.json"


def read_stream(
    spark: Any,
    *,
    bootstrap: str,
    topics: list[str] | None = None,
    pattern: str | None = None,
    source: str = "auto",
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    min_partitions: int | None = None,
    fail_on_data_loss: bool = True,
    checkpoint: str | None = None,
    isolation_level: str = "read_committed",
    kafka_conf: str | None = None,
    sizing: Sizing | None = None,
) -> Any:
    """A streaming DataFrame of Kafka records, with exactly :data:`COLUMNS`; a consumer of
    ``isolation_level`` sees them (both sources read Kafka's ``kafka.isolation.level``).
    ``kafka_conf`` is the client properties file's path (TLS, SASL): the Python source reads
    it on each process, Spark's own has its Java client read the secrets from it. ``sizing``:
    batches sized for a freshness target (the Python source only; its upper bound replaces
    ``max_offsets_per_trigger``)."""
    if bool(topics) == bool(pattern):
        raise ConfigError("Expected topics or a pattern to subscribe to (exactly one).")
    kind = choose(spark, source, sized=sizing is not None)
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "startingOffsets": starting_offsets,
        "failOnDataLoss": str(fail_on_data_loss).lower(),
        "kafka.isolation.level": isolation_level,
    }
    options["subscribe" if topics else "subscribePattern"] = (
        ",".join(topics) if topics else str(pattern)
    )
    if max_offsets_per_trigger:
        options["maxOffsetsPerTrigger"] = str(max_offsets_per_trigger)
    if min_partitions:
        options["minPartitions"] = str(min_partitions)
    if kind == "python":
        from pipeline.ingest import spark_source

        if checkpoint:
            options["initialOffsetsPath"] = initial_offsets_path(checkpoint)
        if kafka_conf:
            options["kafkaConf"] = kafka_conf
        if sizing is not None:
            options.update(sizing.options())
        spark_source.register(spark)
        reader = spark.readStream.format(spark_source.NAME)
    else:
        from pipeline.ingest.kafka import conf

        options.update(conf.load(kafka_conf).spark_options())
        reader = spark.readStream.format("kafka")
    return reader.options(**options).load().select(*COLUMNS)
