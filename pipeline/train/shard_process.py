"""A parameter-server shard's process (``python -m pipeline.train.shard_process FD``): the
child's half of :class:`~pipeline.train.sharded.ShardedServer`, and how the driver starts it
(:func:`spawn`).

It reads its settings (its slice, the algorithm's config, the run's secret) from the
driver's end of a socket pair, never argv or the environment; leaves the terminal's
process group and dies with its parent; serves a
:class:`~pipeline.train.ps.server.ParameterServer` over its slice; and answers the
driver's requests (checkpoint, restore, stats, a task's applied count) on that pair
alone, so that no new operation reaches the network.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from multiprocessing import connection
from typing import Any

from pipeline.cluster import processes
from pipeline.train import algorithms
from pipeline.train.model import ModelSpec


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


def serve_shard(fd: int) -> None:
    """A shard's process: its settings from the driver's end of socket ``fd``, then a
    parameter server over its slice, answering the driver there until the driver asks it
    to stop or goes away."""
    from pipeline.train.server import parameter_server

    conn = connection.Connection(fd)
    job = conn.recv()
    # A Ctrl-C in the terminal reaches the driver, which stops the shards.
    processes.leave_terminal_group()
    processes.die_with_parent(job["parent"])
    try:
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
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ok", server.port))
    try:
        while True:
            try:
                op, arg = conn.recv()
            except (EOFError, OSError):
                return  # the driver is gone
            if op == "stop":
                return
            try:
                conn.send(("ok", _answer(server, algorithm, op, arg)))
            except Exception as e:
                conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        server.stop()


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
