"""Where the work runs: a SparkSession set up for streamtrain, its JVM's class archive,
and running a function on the executors.

Importing the package is cheap; pyspark loads when a session starts.
"""

from pipeline.cluster.executors import driver_host, local_slots, run_on_executors, task_threads
from pipeline.cluster.session import quiet_query_failure, session, stop

__all__ = ["driver_host", "local_slots", "quiet_query_failure", "run_on_executors", "session", "stop",
           "task_threads"]
