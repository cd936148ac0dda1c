"""Saying when Spark's master and workers are ready: they run in the foreground and log
a great deal, none of it a plain "ready". A watcher process reads the JVM's log (its
stderr, through a pipe), relays every byte, and prints one ``... ready at ...`` line to
stdout when the master has been elected leader or the worker has registered."""

from __future__ import annotations

import os
import re
import signal

#: The lines of Spark's log that say what the ready line needs.
_STARTED = re.compile(
    r"Starting Spark (?:master|worker) (\S+?)(?::(\d+))? with (\d+) cores?, (.+?) RAM"
)
_MASTER_AT = re.compile(r"Starting Spark master at (spark://\S+)")
_WEBUI = re.compile(r"Bound (?:Master|Worker)WebUI to (\S+), and started at https?://[^\s:]+:(\d+)")
_LEADER = "I have been elected leader"
_REGISTERED = re.compile(r"Successfully registered with master (spark://\S+)")


class Ready:
    """What a master's or a worker's log has said so far, and its ready line once it is.

    Example:
        >>> r = Ready("worker")
        >>> r.feed(
        ...     "INFO Worker: Starting Spark worker 10.0.0.2:41234 with 4 cores, 8.0 GiB RAM"
        ... ) is None
        True
        >>> r.feed(
        ...     "INFO WorkerWebUI: Bound WorkerWebUI to 127.0.0.1, and started at http://10.0.0.2:8081"
        ... ) is None
        True
        >>> r.feed(
        ...     "INFO Worker: Successfully registered with master spark://10.0.0.1:7077"
        ... )  # doctest: +NORMALIZE_WHITESPACE
        'spark worker ready at 10.0.0.2:41234: registered with spark://10.0.0.1:7077, 4 cores and
        8.0 GiB for executors (web UI on 127.0.0.1:8081 only)'
        >>> m = Ready("master")
        >>> for line in ("Starting Spark master at spark://10.0.0.1:7077",
        ...              "Bound MasterWebUI to 127.0.0.1, and started at http://10.0.0.1:8080"):
        ...     _ = m.feed(line)
        >>> m.feed(
        ...     "INFO Master: I have been elected leader! New state: ALIVE"
        ... )  # doctest: +NORMALIZE_WHITESPACE
        'spark master ready at spark://10.0.0.1:7077 (web UI on 127.0.0.1:8080 only; streamtrain
        cluster-status spark://10.0.0.1:7077 lists the workers)'
    """

    def __init__(self, role: str) -> None:
        self.role = role
        self.said = False
        self._seen: dict[str, str] = {}

    def feed(self, line: str) -> str | None:
        """Take one line of the log; the ready line the first time it is ready, else None."""
        if self.said:
            return None
        for key, pattern in (("started", _STARTED), ("master", _MASTER_AT), ("webui", _WEBUI)):
            found = pattern.search(line)
            if found:
                self._seen[key] = found.group(0)
                self._seen.update({f"{key}{i}": g or "" for i, g in enumerate(found.groups(), 1)})
        seen = self._seen
        ui = f"web UI on {seen['webui1']}:{seen['webui2']} only" if "webui" in seen else ""
        if self.role == "master" and _LEADER in line:
            self.said = True
            master = seen.get("master1", "spark://?")
            return (
                f"spark master ready at {master} ({ui + '; ' if ui else ''}streamtrain "
                f"cluster-status {master} lists the workers)"
            )
        registered = _REGISTERED.search(line)
        if self.role == "worker" and registered:
            self.said = True
            what = (
                f", {seen['started3']} cores and {seen['started4']} for executors"
                if "started" in seen
                else ""
            )
            return (
                f"spark worker ready at {seen.get('started1', '?')}:{seen.get('started2', '?')}: "
                f"registered with {registered.group(1)}{what}{f' ({ui})' if ui else ''}"
            )
        return None


def watch_stderr(role: str) -> None:
    """Route this process's stderr through a watcher child that relays it and prints the
    ready line; call just before ``exec``. The child ignores SIGINT and SIGTERM (they are the
    JVM's to handle) and ends when the JVM's last copy of the pipe closes."""
    read_fd, write_fd = os.pipe()
    if os.fork() == 0:  # the watcher
        os.close(write_fd)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        ready = Ready(role)
        try:
            with os.fdopen(read_fd, "rb", buffering=0) as pipe:
                for raw in iter(pipe.readline, b""):
                    os.write(2, raw)
                    line = ready.feed(raw.decode(errors="replace"))
                    if line:
                        os.write(1, (line + "\n").encode())
        finally:
            os._exit(0)
    os.close(read_fd)
    os.dup2(write_fd, 2)
    os.close(write_fd)
