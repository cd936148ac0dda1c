"""Where the work runs: a SparkSession set up for streamtrain, its JVM's class archive,
running a function on the executors, and the run's child processes
(:mod:`~pipeline.cluster.processes`).

Importing the package is cheap (producers and the embedded broker use its process
helpers): the names below load their module on first use, and pyspark loads when a
session starts.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.cluster.executors import driver_host, local_slots, run_on_executors, task_threads
    from pipeline.cluster.processes import ChildProcess, die_with_parent, stop_on_signals
    from pipeline.cluster.session import quiet_query_failure, session, stop

_EXPORTS = {
    "driver_host": "pipeline.cluster.executors", "local_slots": "pipeline.cluster.executors",
    "run_on_executors": "pipeline.cluster.executors", "task_threads": "pipeline.cluster.executors",
    "ChildProcess": "pipeline.cluster.processes", "die_with_parent": "pipeline.cluster.processes",
    "stop_on_signals": "pipeline.cluster.processes", "quiet_query_failure": "pipeline.cluster.session",
    "session": "pipeline.cluster.session", "stop": "pipeline.cluster.session",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pipeline.cluster' has no attribute {name!r}")


__all__ = ["ChildProcess", "die_with_parent", "driver_host", "local_slots", "quiet_query_failure",
           "run_on_executors", "session", "stop", "stop_on_signals", "task_threads"]
