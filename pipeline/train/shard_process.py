"""A server shard's process (``python -m pipeline.train.shard_process FD``): the child's half
of :class:`~pipeline.train.sharded.ShardedServer` (a slice of the dense weights) and of
:class:`~pipeline.train.row_servers.RowServers` (a shard of the ID tables), and how the
driver starts and asks them (:func:`spawn`, :class:`Children`).

It reads its settings (its slice or tables, the run's secret) from the driver's end of a
socket pair, never argv or the environment; leaves the terminal's process group and dies
with its parent; serves a :class:`~pipeline.train.ps.server.ParameterServer` over its
slice, or a :class:`~pipeline.train.ps.row_server.RowServer`; and answers the driver's
requests (checkpoint, restore, stats, a task's applied count; the tables' clock, changes
and rows) on that pair alone, so that no new operation reaches the network.

Row servers get a process of their own because their requests come every mini-batch from
every worker: in the driver's process each waited for the interpreter behind Spark's
driver threads and the dense server (a request took 17 ms as a worker saw it, of which
its answer took 3-4 ms).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing import connection
from typing import Any

from pipeline.cluster import processes
from pipeline.errors import StreamtrainError
from pipeline.train import algorithms
from pipeline.train.model import ModelSpec

#: Seconds a shard has to start (spawn a Python, import numpy and the protocol, bind).
START_TIMEOUT_S = 60.0
#: Request durations a row shard keeps for the driver's metrics between two ``stats``.
_DURATIONS_KEPT = 100_000


def spawn(job: dict[str, Any]) -> tuple[subprocess.Popen[bytes], connection.Connection]:
    """Start a shard's process and hand it ``job`` (its settings); the process, and the
    driver's end of the pair it answers on."""
    ours, theirs = socket.socketpair()
    with theirs:
        # ``python -m``, not multiprocessing's spawn: that would run the user's main
        # script again in the child. The settings (the secret among them) follow on
        # the pair of sockets only this process holds, never in argv or the environment.
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.train.shard_process", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
    conn = connection.Connection(ours.detach())
    try:
        conn.send({**job, "parent": os.getpid()})
    except BaseException:  # a child that died at import, or a Ctrl-C mid-send: not left behind
        proc.kill()
        proc.wait()
        conn.close()
        raise
    return proc, conn


class Children:
    """The driver's side of a set of shard processes: started together, asked together.

    Args:
        jobs: each child's settings (one child per job).
        what: how errors name a child ("Parameter-server shard").
    """

    def __init__(self, jobs: list[dict[str, Any]], what: str) -> None:
        self.jobs, self.what = jobs, what
        self.procs: list[tuple[subprocess.Popen[bytes], connection.Connection]] = []
        self._lock = threading.Lock()

    def start(self) -> list[Any]:
        """Start every child; what each answered once it serves (its port)."""
        try:
            for job in self.jobs:
                self.procs.append(spawn(job))
            ready = [self._receive(i, START_TIMEOUT_S) for i in range(len(self.procs))]
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)
        return ready

    def stop(self) -> None:
        """Stop every child (asked first, killed by its pid 10 s later); their ports are free on
        return."""
        children, self.procs = self.procs, []
        for _, conn in children:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("stop", None))
        for proc, conn in children:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            conn.close()
        atexit.unregister(self.stop)

    def _gone(self, i: int) -> StreamtrainError:
        proc = self.procs[i][0]
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        return StreamtrainError(
            f"{self.what} {i} exited (status {proc.returncode}); "
            "see the run's log for why, then resume the run."
        )

    def _receive(self, i: int, timeout_s: float | None = None) -> Any:
        conn = self.procs[i][1]
        try:
            if timeout_s is not None and not conn.poll(timeout_s):
                raise StreamtrainError(f"{self.what} {i} did not start in {timeout_s:.0f} s.")
            status, value = conn.recv()
        except (EOFError, OSError):
            raise self._gone(i) from None
        if status != "ok":
            raise StreamtrainError(f"{self.what} {i}: {value}")
        return value

    def ask(self, op: str, args: list[Any] | None = None) -> list[Any]:
        """Send ``op`` to every child at once (with ``args[i]`` to child ``i``); their answers
        in order. Every answer is read before the first error is raised, so that the next
        request reads its own answers."""
        with self._lock:
            if not self.procs:
                raise StreamtrainError(f"The {self.what.lower()}s are not running.")
            errors: list[StreamtrainError] = []
            sent = []
            for i, (_, conn) in enumerate(self.procs):
                try:
                    conn.send((op, args[i] if args is not None else None))
                    sent.append(i)
                except OSError:
                    errors.append(self._gone(i))
            answers = []
            for i in sent:
                try:
                    answers.append(self._receive(i))
                except StreamtrainError as e:
                    errors.append(e)
            if errors:
                raise errors[0]
            return answers


def serve_shard(fd: int) -> None:
    """A shard's process: its settings from the driver's end of socket ``fd``, then a
    parameter server over its slice (or a row server over its tables), answering the
    driver there until the driver asks it to stop or goes away."""
    conn = connection.Connection(fd)
    job = conn.recv()
    # A Ctrl-C in the terminal reaches the driver, which stops the shards.
    processes.leave_terminal_group()
    processes.die_with_parent(job["parent"])
    try:
        server, answer = (_rows if job.get("kind") == "rows" else _dense)(job)
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ok", server.address[1]))
    try:
        while True:
            try:
                op, arg = conn.recv()
            except (EOFError, OSError):
                return  # the driver is gone
            if op == "stop":
                return
            try:
                conn.send(("ok", answer(op, arg)))
            except Exception as e:
                conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        server.stop()


def _dense(job: dict[str, Any]) -> tuple[Any, Callable[[str, Any], Any]]:
    from pipeline.train.server import parameter_server

    # Kept: the driver's raise of the learning rate (--on-drift adapt) reaches it here.
    algorithm = algorithms.get(job["algorithm"])
    server = parameter_server(
        algorithm,
        ModelSpec.from_json(job["spec"]),
        job["weights"],
        secret=job["secret"],
        host=job["host"],
        port=job["port"],
        sync_timeout_s=job["sync_timeout_s"],
        shared_memory=job["shared_memory"],
        straggler_wait=job["straggler_wait"],
        clock=job["clock"],
        optimizer=job["optimizer"],
    ).start()
    return server, lambda op, arg: _answer(server, algorithm, op, arg)


def _rows(job: dict[str, Any]) -> tuple[Any, Callable[[str, Any], Any]]:
    """A row server over the job's tables; its requests' seconds go to the driver with each
    ``stats`` (the driver's metrics observe them there)."""
    from pipeline.train.ps.row_server import RowServer, answer_driver
    from pipeline.train.ps.rows import RowSpec

    durations: collections.deque[float] = collections.deque(maxlen=_DURATIONS_KEPT)
    server = RowServer(
        [RowSpec(**spec) for spec in job["specs"]],
        secret=job["secret"],
        host=job["host"],
        shard=job["shard"],
        shards=job["shards"],
        on_request=lambda _op, seconds: durations.append(seconds),
    ).start()

    def answer(op: str, arg: Any) -> Any:
        got = answer_driver(server, op, arg)
        if op == "stats":
            got["durations"] = [durations.popleft() for _ in range(len(durations))]
        return got

    return server, answer


def _answer(server: Any, algorithm: Any, op: str, arg: Any) -> Any:
    if op == "lr_scale":  # the algorithm's own optimizer, which the server's rule steps
        return algorithm.scale_learning_rate(arg)
    if op == "weights":
        return server.weights()
    if op == "snapshot":
        return server.snapshot()
    if op == "checkpoint":
        return (*server.checkpoint(), server.pushes_applied)
    if op == "restore":
        return server.restore(*arg)
    if op == "expect":
        return server.expect_workers(arg)
    if op == "applied":
        return server.applied(arg)
    if op == "stats":
        return server.stats()
    raise ValueError(f"unknown request {op!r}")


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname).1s ps-shard %(name)s: %(message)s"
    )
    serve_shard(int(sys.argv[1]))
