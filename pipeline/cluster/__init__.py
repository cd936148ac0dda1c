"""Where the work runs: a SparkSession set up for streamtrain, its JVM's class archive,
running a function on the executors, and the run's child processes
(:mod:`~pipeline.cluster.processes`).

Importing the package is cheap (producers and the embedded broker use its process
helpers): its modules import the standard library only at the top, and pyspark loads
when a session starts. The names are imported here, not looked up lazily: the function
``session`` shares its name with its module, and a lazy lookup would hand out the module
once anything had imported ``pipeline.cluster.session``.
"""

from pipeline.cluster.executors import driver_host, local_slots, run_on_executors, task_threads
from pipeline.cluster.processes import ChildProcess, die_with_parent, stop_on_signals
from pipeline.cluster.session import quiet_query_failure, session, stop

__all__ = [
    "ChildProcess",
    "die_with_parent",
    "driver_host",
    "local_slots",
    "quiet_query_failure",
    "run_on_executors",
    "session",
    "stop",
    "stop_on_signals",
    "task_threads",
]
