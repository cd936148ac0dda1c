"""A standalone cluster seen from the driver: the address its executors reach the driver
at, the master reached before Spark starts, and a start that stalls (no executor
registers) turned into one line naming what is unreachable.

Spark itself advertises the driver's host name, which other hosts may not resolve, and
a driver its executors cannot reach waits for ever, printing "Initial job has not
accepted any resources" every 15 s (the cause is in each executor's stderr, on its host).
"""

from __future__ import annotations

import socket
import time
from typing import Any

from pipeline.cluster import status
from pipeline.errors import ConfigError, StreamtrainError

__all__ = ["await_executors", "check_master", "driver_address", "master_address"]


def master_address(master: str) -> tuple[str, int]:
    """Host and port of a ``spark://HOST:PORT`` master (the first, for a list).

    >>> master_address("spark://10.0.0.1:7077"), master_address("spark://m")
    (('10.0.0.1', 7077), ('m', 7077))
    """
    first = master[len("spark://") :].split(",")[0]
    host, _, port = first.rpartition(":") if ":" in first else (first, "", "7077")
    return host, int(port or 7077)


def check_master(master: str, *, wait_s: float = 60.0) -> None:
    """Connect to the master's port from here, trying for ``wait_s`` (a master started at
    the same time is still coming up); ConfigError (one line) if it cannot be reached,
    instead of Spark retrying and failing in a traceback."""
    host, port = master_address(master)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            socket.create_connection((host, port), timeout=min(5.0, max(0.5, wait_s))).close()
            return
        except OSError as e:
            reason = e.strerror or type(e).__name__
        if time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    raise ConfigError(
        f"Cannot reach Spark's master at {master} from this host within {wait_s:g} s ({reason}). "
        f"Start it there (streamtrain spark-master --host {host}), check the address, and open "
        f"port {port} from this host."
    )


def driver_address(master: str, local_ip: str | None) -> str:
    """The address the cluster's executors reach the driver at: ``SPARK_LOCAL_IP`` when
    set, else this host's address on the route to the master (the workers reach the
    master, so they reach that network)."""
    if local_ip:
        return local_ip
    host, port = master_address(master)
    with socket.socket(
        socket.AF_INET, socket.SOCK_DGRAM
    ) as s:  # no packet: connect() only picks the route
        try:
            s.connect((host, port))
            return str(s.getsockname()[0])
        except OSError:
            return socket.gethostbyname(socket.gethostname())


def _workers(master: str) -> list[str] | None:
    """The alive workers' addresses by the master's web UI (8080; on the master's loopback,
    so read only from its machine), None if it cannot be read."""
    try:
        state = status.read(status.webui_url(master))
    except (OSError, ValueError):
        return None
    return [f"{w.get('host')}" for w in state.get("workers", []) if w.get("state") == "ALIVE"]


def await_executors(spark: Any, master: str, *, timeout_s: float) -> int:
    """Wait until an executor has registered with the driver; return how many did.

    None within ``timeout_s``: StreamtrainError in one line, naming the driver's address
    the executors failed to reach, or the master's lack of workers.
    """
    sc = spark.sparkContext
    deadline = time.monotonic() + timeout_s
    while True:
        registered = (
            int(sc._jsc.sc().getExecutorMemoryStatus().size()) - 1
        )  # the driver counts itself
        if registered > 0:
            return registered
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    driver = f"{spark.conf.get('spark.driver.host')}:{spark.conf.get('spark.driver.port', '?')}"
    workers = _workers(master)
    if workers == []:
        where = (
            f"the master at {master} has no alive worker: start one (streamtrain spark-worker "
            f"{master} ...)"
        )
    else:
        on = f" (alive: {', '.join(workers)})" if workers else ""
        where = (
            f"the workers{on} started none that reached this driver at {driver}: set "
            "SPARK_LOCAL_IP to this host's address the workers reach, open spark.driver.port and "
            "spark.blockManager.port to them, and see an executor's stderr in the worker's work "
            "folder"
        )
    raise StreamtrainError(f"No Spark executor registered within {timeout_s:g} s: {where}.")
