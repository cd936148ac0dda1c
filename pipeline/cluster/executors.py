"""Running a function on the executors: one task per item, results back on the driver."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_on_executors(
    spark: Any, items: Sequence[T], fn: Callable[[T], R], *, description: str
) -> list[R]:
    """``[fn(item) for item in items]``, each call in its own Spark task, in order.

    ``fn`` and ``items`` travel to the executors with the tasks, so keep both small
    and picklable (settings, addresses, a broadcast: not connections or models).
    ``description`` names the job in Spark's UI and logs.
    """
    if not items:
        return []

    def task(part: Iterable[T]) -> Iterator[R]:
        for item in part:
            yield fn(item)

    sc = spark.sparkContext
    sc.setJobDescription(description)
    return list(sc.parallelize(list(items), len(items)).mapPartitions(task).collect())


def driver_host(spark: Any) -> str:
    """The address executors reach the driver at: loopback in local mode (nothing bound
    beyond it), else the driver host Spark advertises."""
    if spark.sparkContext.master.startswith("local"):
        return "127.0.0.1"
    return str(spark.conf.get("spark.driver.host"))


def local_slots(master: str, workers: int, cores: int) -> tuple[str, str | None]:
    """The master to start for ``workers`` replicas, and a warning where they cannot all run at
    once.

    Spark's ``local[*]`` has one task slot per core, so 4 workers on 2 cores would train 2
    at a time and staleness would show half of what 4 concurrent replicas give. In local
    mode with ``*`` the run takes a slot per worker (they share the cores, one TensorFlow
    thread each); a fixed ``local[N]`` below the workers is kept, with a warning.

    >>> local_slots("local[*]", 4, 2)
    ('local[4]', None)
    >>> local_slots("local[*]", 2, 8)
    ('local[*]', None)
    >>> local_slots("local[2]", 4, 8)[1]  # doctest: +NORMALIZE_WHITESPACE
    'local[2] has 2 task slots for 4 workers: only 2 replicas train at a time (pass --master
    local[4])'
    """
    if not master.startswith("local"):
        return master, None
    inner = master[len("local[") : -1] if master.startswith("local[") else "1"
    slots = (
        cores
        if inner == "*"
        else int(inner.split(",")[0])
        if inner.split(",")[0].isdigit()
        else cores
    )
    if slots >= workers:
        return master, None
    if inner == "*":
        return f"local[{workers}]", None
    return master, (
        f"{master} has {slots} task slots for {workers} workers: only {slots} replicas train at a "
        f"time (pass --master local[{workers}])"
    )


def task_threads(spark: Any, workers: int) -> int:
    """TensorFlow threads for each of ``workers`` concurrent tasks: the cores Spark has, shared."""
    return max(1, int(spark.sparkContext.defaultParallelism) // workers)
