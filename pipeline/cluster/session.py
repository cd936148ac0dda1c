"""A SparkSession set up the way streamtrain needs it (the facts behind each setting are in
DESIGN.md)."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.cluster.zygote import Zygote


def session(
    master: str = "local[*]",
    *,
    app: str = "streamtrain",
    conf: dict[str, str] | None = None,
    zygote: Zygote | None = None,
    local_ip: str | None = None,
    executor_wait_s: float = 120.0,
    source: str | None = None,
) -> Any:
    """Get or create a SparkSession for streamtrain; stop it with :func:`stop`.

    * Python workers run this interpreter, or they start a Python without our packages.
    * The driver JVM gets a 16 MB thread stack: stopping a query inside foreachBatch
      otherwise dies with a StackOverflowError that hides the real error.
    * It compiles with C1 only: C2's compiler threads compete with TensorFlow's start-up
      for the cores (start-up 2 s shorter on 2 cores), and the JVM is not on the hot path
      (Python reads and trains the records). For the same reason it collects with the
      serial collector from a 64 MB heap: no collector threads beside TensorFlow's, and the
      heap grows only as far as it is used (driver memory 430 -> 330 MB).
    * It maps its classes from an archive built after an earlier run
      (:mod:`pipeline.cluster.jvmcache`).
    * Local mode, and a cluster whose master is on loopback, bind the driver to loopback;
      the UI is off unless asked for. On another host's master, the driver binds and
      advertises ``local_ip`` (else its address on the route to the master), not its
      host name; on any ``spark://`` master it waits
      ``executor_wait_s`` at most for an executor to register (:mod:`pipeline.cluster.reach`).

    * With a ``zygote``, the Python processes Spark starts (its workers' daemon, the
      query's data-source helpers) are forked from it, their imports done
      (:mod:`pipeline.cluster.zygote`).

    * Secret settings (``spark.authenticate.secret``, any ``*.password``, ``*.secret`` or
      ``*.token``) reach the JVM through a properties file only this user reads, removed
      once the JVM has read it: PySpark passes every other setting to spark-submit as
      ``--conf k=v``, readable in ``/proc/PID/cmdline`` by every local user.

    * With ``source`` ``jvm``, Spark's own Kafka source's jars go on ``spark.jars``
      (resolved into the cache where needed; on a ``spark://`` master Spark ships them to
      the executors; :mod:`pipeline.cluster.kafka_jars`).

    ``conf`` adds to or overrides these settings; its ``spark.driver.extraJavaOptions``
    come after streamtrain's, so they win.

    Raises:
        ConfigError: ``source="jvm"`` and its jars cannot be had (one line).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pipeline.cluster.security import on_loopback

    loopback = on_loopback(master)
    if loopback:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # nothing bound beyond loopback
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from pipeline.cluster import kafka_jars

    conf = kafka_jars.spark_conf(source, conf)
    hidden = {k: conf.pop(k) for k in list(conf) if is_secret(k)}
    java = ["-Xss16m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xms64m"]
    if SparkContext._gateway is None:  # a JVM is about to start (not one already running)
        from pipeline.cluster import jvmcache

        jvmcache.check_java()
        java += jvmcache.options()
    java += [conf.pop("spark.driver.extraJavaOptions", "")]
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.driver.extraJavaOptions", " ".join(o for o in java if o))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.ui.showConsoleProgress", "false")  # our own status line says more
    )
    if loopback:
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    elif master.startswith("spark://"):
        from pipeline.cluster import reach

        address = reach.driver_address(master, local_ip)
        builder = builder.config("spark.driver.bindAddress", address).config(
            "spark.driver.host", address
        )
    for key, value in conf.items():
        builder = builder.config(key, value)
    # The context takes its Pythons from the environment when it is created, and keeps them
    # (the driver's runs the query's data-source helpers).
    pythons = {k: os.environ[k] for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    if zygote is not None:
        os.environ.update(dict.fromkeys(pythons, zygote.python()))
    try:
        with _properties_file(hidden):
            spark = builder.getOrCreate()
    finally:
        os.environ.update(pythons)
    spark.sparkContext.setLogLevel("WARN")
    if master.startswith("spark://"):
        from pipeline.cluster import reach

        try:
            reach.await_executors(spark, master, timeout_s=executor_wait_s)
        except Exception:
            spark.stop()
            raise
    # Two warnings every clean run printed, about nothing the user can act on: stopping a
    # query cancels its job group, and the DAGScheduler warns when no job was running; and
    # each stream start says adaptive execution is off for streams (it stays on for batch).
    jvm: Any = spark.sparkContext._jvm
    log4j = jvm.org.apache.logging.log4j
    for logger in (
        "org.apache.spark.scheduler.DAGScheduler",
        "org.apache.spark.sql.execution.streaming.runtime.ResolveWriteToStream",  # Spark 4.1+
        "org.apache.spark.sql.execution.streaming.ResolveWriteToStream",
    ):
        log4j.core.config.Configurator.setLevel(logger, log4j.Level.ERROR)
    return spark


def is_secret(key: str) -> bool:
    """Whether a Spark setting holds a secret (kept off command lines).

    >>> (
    ...     is_secret("spark.authenticate.secret"),
    ...     is_secret("spark.ssl.keyPassword"),
    ...     is_secret("spark.app.name"),
    ... )
    (True, True, False)
    """
    last = key.rsplit(".", 1)[-1].lower()
    return last.endswith(("secret", "password", "token"))


@contextlib.contextmanager
def _properties_file(props: dict[str, str]) -> Iterator[None]:
    """While the JVM starts, ``PYSPARK_SUBMIT_ARGS`` names a mode-0600 properties file of
    ``props`` in a mode-0700 folder; both are gone afterwards (spark-submit read the file)."""
    if not props:
        yield
        return
    before = os.environ.get("PYSPARK_SUBMIT_ARGS")
    with tempfile.TemporaryDirectory(prefix="streamtrain-spark-") as folder:  # mkdtemp: mode 0700
        path = os.path.join(folder, "secret.conf")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(f"{k} {v}\n" for k, v in props.items()))
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f"--properties-file {shlex.quote(path)} {before or 'pyspark-shell'}"
        )
        try:
            yield
        finally:
            if before is None:
                os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
            else:
                os.environ["PYSPARK_SUBMIT_ARGS"] = before


def quiet_query_failure(spark: Any) -> None:
    """Keep Spark from logging the failure of the streaming query about to fail: the caller
    reports it in one line itself (a StreamtrainError a batch raised, such as a checkpoint
    that could not be written). Spark's log of it is a Java stack with the Python traceback
    inside, ahead of that line."""
    jvm: Any = spark.sparkContext._jvm
    log4j = jvm.org.apache.logging.log4j
    for logger in (
        "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution",  # Spark 4.1+
        "org.apache.spark.sql.execution.streaming.MicroBatchExecution",
    ):
        log4j.core.config.Configurator.setLevel(logger, log4j.Level.OFF)


def stop(spark: Any) -> None:
    """Stop ``spark``; a JVM that recorded its classes exits too, and the archive for
    later runs is built in the background (:mod:`pipeline.cluster.jvmcache`)."""
    from pyspark import SparkContext

    from pipeline.cluster import jvmcache

    spark.stop()
    gateway = SparkContext._gateway
    if jvmcache.recording() and gateway is not None:
        SparkContext._gateway = SparkContext._jvm = None  # a later session starts a new JVM
        jvmcache.after_stop(gateway)
