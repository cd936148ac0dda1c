"""A worker's client of the parameter server: what it asks (pull, push, a task's progress);
its :mod:`~pipeline.train.ps.channel` carries the frames."""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.train.ps import protocol as p
from pipeline.train.ps.channel import Channel


def parse_address(address: str | tuple[str, int]) -> tuple[str, int]:
    """``"host:port"`` or ``(host, port)``.

    >>> parse_address("127.0.0.1:7000")
    ('127.0.0.1', 7000)
    """
    if isinstance(address, tuple):
        return address
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"Expected a parameter-server address HOST:PORT. Received: {address!r}")
    return host, int(port)


class Client:
    """Pull and push flat float32 weights.

    Args:
        address: the server's ``(host, port)`` or ``"host:port"``.
        secret: the per-run secret.
        worker: this worker's id (staleness is tracked per id).
        size: number of weights.
        timeout_s: socket timeout.
        shared_memory: move payloads through shared memory when the server offers
            it, this process can map it, and the connection's two ends have one address
            (a worker on the server's machine); else, or with False, over the socket.
            :attr:`shared` says which.
        wire_dtype: the payloads' type on the socket: float32, or bfloat16 or float16 for
            half the bytes (:mod:`pipeline.train.ps.wire`; shared memory stays float32).

    The arrays that :meth:`pull` and :meth:`push_pull` return are this client's
    receive buffer: valid until its next call (copy them to keep them).

    After :meth:`begin`, each push names the task and its exchange's index, and the
    server applies it once however many attempts push it (see :mod:`pipeline.train.ps.tasks`).
    """

    def __init__(
        self,
        address: str | tuple[str, int],
        *,
        secret: bytes,
        worker: int,
        size: int,
        timeout_s: float = 60.0,
        shared_memory: bool = True,
        wire_dtype: str = "float32",
    ) -> None:
        self.address = parse_address(address)
        self.wire_dtype = wire_dtype
        self.worker = worker
        self.size = size
        self.clock = 0
        self.last_staleness = 0
        self.repeats = 0  # pushes the server dropped as repeats of applied exchanges
        self._task = (0, 0, 1)  # key, steps in all, steps per exchange
        self._exchange = 0  # the last exchange pushed in the task
        self._channel = Channel(
            self.address,
            secret=secret,
            worker=worker,
            size=size,
            timeout_s=timeout_s,
            shared_memory=shared_memory,
            wire_dtype=wire_dtype,
        )

    @property
    def shared(self) -> bool:
        """Whether payloads travel through shared memory rather than the socket."""
        return self._channel.shared

    def pull(self) -> np.ndarray:
        """The center weights now; remembers the clock for staleness."""
        reply, _ = self._channel.request(p.PULL, clock=self.clock)
        self.clock = reply.clock
        return self._channel.center()

    def peek(self) -> np.ndarray:
        """The center weights now, read without counting as this worker's pull (no
        synchronous round waits for a peeker); :attr:`clock` is the center's version."""
        reply, _ = self._channel.request(p.PEEK, clock=self.clock)
        self.clock = reply.clock
        return self._channel.center()

    def begin(self, task: int, *, steps: int, window: int) -> int:
        """Name the task the next pushes belong to: ``steps`` mini-batches in all, an
        exchange every ``window`` of them (and one after the last). Returns how many of
        its exchanges the server already applied (an earlier attempt's): the next push
        is the one after them."""
        reply, _ = self._channel.request(p.PROGRESS, clock=self.clock, task=task)
        self._task, self._exchange = (task, steps, max(1, window)), reply.exchange
        return reply.exchange

    def continue_after(self, exchange: int) -> None:
        """Push the task's exchange after ``exchange`` next (a sharded client levels its
        shards: one ahead drops the repeats, see :mod:`pipeline.train.ps.shards`)."""
        self._exchange = exchange

    def _identity(self) -> tuple[int, int, int]:
        """The next push's task, exchange index and the mini-batches it covers (zeros
        outside a task)."""
        task, total, window = self._task
        if not task:
            return 0, 0, 0
        self._exchange += 1
        k = self._exchange
        return task, k, max(0, min(k * window, total) - (k - 1) * window)

    def _pushed(self, reply: p.Header, identity: tuple[int, int, int]) -> None:
        self.last_staleness = reply.flags
        if identity[0] and identity[2] and reply.steps == 0:
            self.repeats += 1

    def push(self, delta: np.ndarray) -> int:
        """Send an update; return its staleness (updates applied since this worker pulled)."""
        identity = self._identity()
        reply, _ = self._channel.request(
            p.PUSH,
            delta,
            clock=self.clock,
            task=identity[0],
            exchange=identity[1],
            steps=identity[2],
        )
        self._pushed(reply, identity)
        return reply.flags

    def push_pull(self, delta: np.ndarray) -> np.ndarray:
        """Send an update and get the new center in one round trip."""
        identity = self._identity()
        reply, _ = self._channel.request(
            p.PUSH_PULL,
            delta,
            clock=self.clock,
            task=identity[0],
            exchange=identity[1],
            steps=identity[2],
        )
        self.clock = reply.clock
        self._pushed(reply, identity)
        return self._channel.center()

    def stats(self) -> dict[str, Any]:
        _, body = self._channel.request(p.STATS, clock=self.clock, most=p.MAX_STATS)
        result: dict[str, Any] = json.loads(bytes(body))
        return result

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
