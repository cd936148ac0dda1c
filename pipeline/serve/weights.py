"""Where served weights come from: the live parameter server, or a run's checkpoint.

Both refresh in a thread of their own, so a request never waits for weights and
training never waits for a request: the live source reads the center with PEEK (one
copy under the server's lock, ~1 ms for the MNIST CNN; it joins no synchronous round),
the checkpoint source reloads ``state.npz`` when the run writes a new one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np

from pipeline.train import checkpoint
from pipeline.train.ps.client import Client, parse_address
from pipeline.train.ps.shards import Shard, ShardedClient, connect

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """Center weights, their version (the parameter server's clock) and when they were
    the center's (wall-clock seconds). ``bounded``: whether a server's bound on the age
    (``--serve-max-age``) applies; not to the checkpoint a starting run serves, the newest
    weights there are until its parameter server is up. ``data_as_of``: the newest data
    they are known to hold (Unix seconds, the oldest partition's: see
    :mod:`pipeline.train.freshness`); None: unknown."""

    weights: np.ndarray
    version: int
    as_of: float
    bounded: bool = True
    data_as_of: float | None = None

    def freshness_s(self, now: float | None = None) -> float | None:
        """Seconds from the newest data these weights hold to ``now`` (None: unknown).

        >>> Snapshot(np.zeros(1, np.float32), 3, as_of=100.0, data_as_of=98.5).freshness_s(
        ...     now=100.25
        ... )
        1.75
        """
        if self.data_as_of is None:
            return None
        return max(0.0, (time.time() if now is None else now) - self.data_as_of)

    def age_s(self, now: float | None = None) -> float:
        """Seconds since these weights were the center's.

        >>> Snapshot(np.zeros(1, np.float32), 3, as_of=100.0).age_s(now=100.25)
        0.25
        """
        return max(0.0, (time.time() if now is None else now) - self.as_of)


class _Refresher:
    """A daemon thread that calls ``_refresh`` every ``interval_s`` until closed."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._latest: Snapshot | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)
        self.error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def latest(self) -> Snapshot | None:
        """The newest weights read, or None before the first read."""
        return self._latest

    def _refresh(self) -> Snapshot | None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                snap = self._refresh()
                if snap is not None:
                    self._latest = snap
                self.error = None
            except Exception as e:  # noqa: BLE001 - the served weights age instead, and the age says so
                if self.error is None:
                    log.warning("cannot refresh the served weights: %s", e)
                self.error = str(e)
            self._stop.wait(self.interval_s)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)


class LiveWeights(_Refresher):
    """The parameter server's center, read every ``interval_s`` seconds.

    Args:
        address: the server's ``host:port``.
        shards: a sharded server's shards (``host, port, start, stop``): the center is read
            from all of them.
        secret: the run's secret (handed over by the process that started the server).
        size: number of weights.
        interval_s: seconds between reads.
        run_dir: the run's folder, whose checkpoint says how fresh the data is: the center
            read after a checkpoint holds at least what it holds (the center only moves on),
            so the figure errs on the stale side by at most the batch in flight. None: unknown.
    """

    def __init__(
        self,
        address: str,
        *,
        secret: bytes,
        size: int,
        interval_s: float = 0.2,
        shards: list[Shard] | None = None,
        run_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        super().__init__(interval_s)
        self.address, self._secret, self.size = address, secret, size
        self.shards = shards or []
        self._client: Client | ShardedClient | None = None
        self._data = _DataTime(run_dir) if run_dir is not None else None

    def _refresh(self) -> Snapshot:
        # Read before the peek: the center peeked holds at least what this checkpoint does.
        data_as_of = self._data.read() if self._data is not None else None
        if self._client is None:
            # Worker id 0xFFFFFFFF: no training worker has it; a peek is no pull anyway.
            self._client = connect(
                parse_address(self.address),
                self.shards,
                secret=self._secret,
                worker=0xFFFFFFFF,
                size=self.size,
                timeout_s=10.0,
            )
        client = self._client
        try:
            weights = client.peek().copy()
        except Exception:
            client.close()
            self._client = None
            raise
        return Snapshot(weights, int(client.clock), time.time(), data_as_of=data_as_of)

    def close(self) -> None:
        super().close()
        if self._client is not None:
            self._client.close()
            self._client = None


class CheckpointWeights(_Refresher):
    """A run's checkpoint (``RUN_DIR/state.npz``), reloaded when the run writes a new one;
    its weights are as old as the file."""

    def __init__(self, run_dir: str | os.PathLike[str], *, interval_s: float = 0.5) -> None:
        super().__init__(interval_s)
        self.path = Path(run_dir) / checkpoint.FILENAME
        self._seen: tuple[int, int] | None = None

    def _refresh(self) -> Snapshot | None:
        stat = self.path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._seen:
            return None
        state = checkpoint.load(self.path.parent)
        if state is None:
            return None
        self._seen = stamp
        as_of = (state.extra.get("freshness") or {}).get("as_of")
        return Snapshot(
            np.asarray(state.weights, np.float32),
            int(state.clock),
            stat.st_mtime,
            data_as_of=None if as_of is None else float(as_of),
        )


class _DataTime:
    """The freshness bound of a run's checkpoint, read again only when the file changes."""

    def __init__(self, run_dir: str | os.PathLike[str]) -> None:
        self.run_dir = Path(run_dir)
        self._seen: tuple[int, int] | None = None
        self._as_of: float | None = None

    def read(self) -> float | None:
        try:
            stat = (self.run_dir / checkpoint.FILENAME).stat()
        except OSError:
            return self._as_of
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._seen:
            as_of = checkpoint.data_as_of(self.run_dir)
            if as_of is not None:  # None: being replaced; the next read sees the new one
                self._seen, self._as_of = stamp, as_of
        return self._as_of


class RunWeights(_Refresher):
    """A starting run's weights: its checkpoint while the run starts (nothing newer exists:
    the age bound does not apply), then, from :meth:`follow` on, its parameter server's live
    center. A restarted run serves at once, not once Spark and its workers are up."""

    def __init__(self, run_dir: str | os.PathLike[str], *, interval_s: float = 0.2) -> None:
        super().__init__(interval_s)
        self._checkpoint = CheckpointWeights(run_dir)
        self._live: LiveWeights | None = None

    def follow(self, live: LiveWeights) -> None:
        """Serve ``live`` from its first read on (until then, the checkpoint's weights)."""
        self._live = live

    def _refresh(self) -> Snapshot | None:
        if self._live is not None:
            return self._live._refresh()
        snap = self._checkpoint._refresh()
        return None if snap is None else dataclasses.replace(snap, bounded=False)

    def close(self) -> None:
        super().close()
        if self._live is not None:
            self._live.close()
