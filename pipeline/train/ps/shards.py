"""A sharded parameter server's plan, and a worker's connection to all its shards at once.

With ``--ps-shards N`` the flat weight buffer is cut into N contiguous slices, each served
by its own :class:`~pipeline.train.ps.server.ParameterServer` (in its own process, on its
own port). Contiguous slices make a worker's split and merge numpy views: a push sends
``delta[start:stop]`` to each shard without a copy. :class:`ShardedClient` has
:class:`~pipeline.train.ps.client.Client`'s interface, so algorithms and partition
training never know how many shards there are.

Every rule is elementwise (a slice of the center changes from the same slice of the delta,
and of the worker's pulled center), and each shard keeps its own task table: a push applied
on every shard is applied once on each, whatever order the shards see the pushes in.
"""

from __future__ import annotations

import bisect
import random
import time
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

import numpy as np

from pipeline.errors import ConfigError
from pipeline.train.ps.client import Client

#: A shard as workers reach it: host, port, and the slice of the flat buffer it serves.
Shard = tuple[str, int, int, int]
#: Cuts no further than this share of a slice from an array's boundary move there instead.
SNAP = 0.05
#: Cuts inside an array fall on multiples of 16 weights (64 bytes: a cache line).
ALIGN = 16

T = TypeVar("T")


def plan(sizes: list[int] | tuple[int, ...], n: int) -> list[tuple[int, int]]:
    """Cut a flat buffer of weight arrays of ``sizes`` into ``n`` contiguous slices of
    about equal size: ``[(start, stop), ...]`` over the flat buffer.

    A cut falls on a boundary between weight arrays where one lies within :data:`SNAP` of a
    slice's size from the even cut; else inside the array (on a multiple of
    :data:`ALIGN`): the MNIST CNN keeps 99% of its weights in one dense kernel, and cutting
    only between arrays would leave one shard with nearly all the work.

    Example:
        >>> plan([100, 100, 100, 100], 2)       # on the boundary between layers
        [(0, 200), (200, 400)]
        >>> plan([10, 1000, 10], 2)             # inside the big array
        [(0, 496), (496, 1020)]
        >>> plan([5], 1), plan([3, 3], 3)
        ([(0, 5)], [(0, 2), (2, 4), (4, 6)])
    """
    total = int(sum(sizes))
    if n < 1 or n > max(1, total):
        raise ConfigError(
            f"Expected between 1 and {total} parameter-server shards for {total} weights. "
            f"Received: {n}"
        )
    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + int(s))
    cuts = [0]
    share = total / n
    for i in range(1, n):
        even = round(i * share)
        j = bisect.bisect_left(bounds, even)
        near = min((b for b in bounds[max(0, j - 1) : j + 1]), key=lambda b: abs(b - even))
        cut = near if abs(near - even) <= SNAP * share else even // ALIGN * ALIGN or even
        cuts.append(min(max(cut, cuts[-1] + 1), total - (n - i)))
    cuts.append(total)
    return list(zip(cuts[:-1], cuts[1:], strict=True))


class ShardedClient:
    """A worker's connection to every shard of a sharded parameter server, with
    :class:`~pipeline.train.ps.client.Client`'s interface.

    Each request goes to all shards at once (one thread per shard beyond the first): a
    push sends each shard its slice of the delta (a view), and the centers they answer are
    gathered into one buffer, valid until the next call. :attr:`clock` is the newest of
    the shards' clocks, :attr:`last_staleness` the largest staleness a shard gave the push.

    Args:
        shards: each shard's ``(host, port, start, stop)``, slices in order, covering ``size``.
        secret, worker, size, timeout_s, shared_memory, wire_dtype: as for
            :class:`~pipeline.train.ps.client.Client`.
    """

    def __init__(
        self,
        shards: list[Shard] | tuple[Shard, ...],
        *,
        secret: bytes,
        worker: int,
        size: int,
        timeout_s: float = 60.0,
        shared_memory: bool = True,
        wire_dtype: str = "float32",
    ) -> None:
        ends = [0] + [stop for _, _, _, stop in shards]
        if not shards or [start for _, _, start, _ in shards] != ends[:-1] or ends[-1] != size:
            raise ConfigError(
                f"Expected shards whose slices cover {size} weights in order. Received: "
                f"{[(start, stop) for _, _, start, stop in shards]}"
            )
        self.slices = [(start, stop) for _, _, start, stop in shards]
        self.worker, self.size, self.wire_dtype = worker, size, wire_dtype
        self.clock = 0
        self.last_staleness = 0
        self._buf = np.empty(size, np.float32)
        self._clients: list[Client] = []
        self._pool = ThreadPoolExecutor(
            max(1, len(shards) - 1), thread_name_prefix="streamtrain-shard"
        )
        try:
            for host, port, start, stop in shards:
                self._clients.append(
                    Client(
                        (host, port),
                        secret=secret,
                        worker=worker,
                        size=stop - start,
                        timeout_s=timeout_s,
                        shared_memory=shared_memory,
                        wire_dtype=wire_dtype,
                    )
                )
        except BaseException:
            self.close()
            raise

    @property
    def shared(self) -> bool:
        """Whether every shard's payloads travel through shared memory."""
        return all(c.shared for c in self._clients)

    @property
    def repeats(self) -> int:
        """Pushes a shard dropped as repeats of applied exchanges (the most of any shard)."""
        return max(c.repeats for c in self._clients)

    def _each(self, call: Any) -> list[Any]:
        """``call(i, client)`` on every shard at once; the results in order. A shard's error is
        raised once every shard answered (none is left mid-frame)."""
        futures: list[Future[Any]] = [
            self._pool.submit(call, i, c) for i, c in enumerate(self._clients) if i
        ]
        first: list[Any] = []
        error: BaseException | None = None
        try:
            first.append(call(0, self._clients[0]))
        except BaseException as e:
            error = e
        results = []
        for f in futures:
            try:
                results.append(f.result())
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error
        return first + results

    def _gather(self, call: Any) -> np.ndarray:
        """Run ``call(i, client)`` (which returns a shard's center) on every shard, each
        center copied into its slice of the buffer as it comes."""

        def one(i: int, c: Client) -> None:
            start, stop = self.slices[i]
            np.copyto(self._buf[start:stop], call(i, c))

        self._each(one)
        self.clock = max(c.clock for c in self._clients)
        return self._buf

    def pull(self) -> np.ndarray:
        """The center weights now (every shard's slice); remembers the clocks for staleness."""
        return self._gather(lambda i, c: c.pull())

    def peek(self) -> np.ndarray:
        """The center now, read without counting as this worker's pull."""
        return self._gather(lambda i, c: c.peek())

    def begin(self, task: int, *, steps: int, window: int) -> int:
        """Name the task of the next pushes on every shard; returns the exchanges every
        shard applied. A shard ahead of another (an attempt that died between two shards'
        pushes) drops the repeats that bring the others level."""
        done = min(self._each(lambda i, c: c.begin(task, steps=steps, window=window)))
        self.continue_after(done)
        return done

    def continue_after(self, exchange: int) -> None:
        """Push the task's exchange after ``exchange`` next, on every shard."""
        for c in self._clients:
            c.continue_after(exchange)

    def push(self, delta: np.ndarray) -> int:
        """Send each shard its slice of an update; return the largest staleness."""
        self._check(delta)
        self.last_staleness = max(self._each(lambda i, c: c.push(delta[slice(*self.slices[i])])))
        return self.last_staleness

    def push_pull(self, delta: np.ndarray) -> np.ndarray:
        """Send each shard its slice of an update and gather the new center."""
        self._check(delta)
        center = self._gather(lambda i, c: c.push_pull(delta[slice(*self.slices[i])]))
        self.last_staleness = max(c.last_staleness for c in self._clients)
        return center

    def _check(self, delta: np.ndarray) -> None:
        if delta.dtype != np.float32 or delta.size != self.size or delta.ndim != 1:
            raise ConfigError(
                f"Expected {self.size} float32 values. Received: {delta.size} {delta.dtype}"
            )

    def stats(self) -> dict[str, Any]:
        """The first shard's figures, and every shard's under ``shards``."""
        each = self._each(lambda i, c: c.stats())
        return {**each[0], "shards": each}

    def close(self) -> None:
        for c in self._clients:
            c.close()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> ShardedClient:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


#: Refusals of a connection that a later try may not meet: a server with its handshake slots
#: or connections taken (by a flood, or a burst of workers), or one that evicted this
#: connection's handshake for a newer one.
_TRY_AGAIN = (OSError,)  # ConnectionError, timeouts, and protocol.Closed among them


def connect(
    address: tuple[str, int],
    shards: list[Shard] | tuple[Shard, ...] = (),
    *,
    retry_s: float = 0.0,
    **kwargs: Any,
) -> Client | ShardedClient:
    """A client of the server at ``address``, or of its ``shards`` where it has more than one.

    A connection that is refused, reset or closed before its handshake ends is tried again
    for up to ``retry_s`` seconds, backing off from 50 ms to 2 s with jitter; a refused
    secret is raised at once. Nothing is exchanged before the handshake, so a retry can
    neither lose nor repeat an update.
    """
    deadline, delay = time.monotonic() + retry_s, 0.05
    while True:
        try:
            if len(shards) > 1:
                return ShardedClient(shards, **kwargs)
            return Client(address, **kwargs)
        except _TRY_AGAIN:
            if time.monotonic() + delay > deadline:
                raise
        time.sleep(
            delay * random.uniform(0.5, 1.0)
        )  # jitter: workers refused together do not return together
        delay = min(2.0, delay * 2)
