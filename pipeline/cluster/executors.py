"""Running a function on the executors: one task per item, results back on the driver."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_on_executors(spark: Any, items: Sequence[T], fn: Callable[[T], R], *, description: str) -> list[R]:
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


def task_threads(spark: Any, workers: int) -> int:
    """TensorFlow threads for each of ``workers`` concurrent tasks: the cores Spark has, shared."""
    return max(1, int(spark.sparkContext.defaultParallelism) // workers)
