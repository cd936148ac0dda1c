"""Consumer lag: how far the log ends are ahead of what the stream has handled."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pipeline.ingest.kafka import conf
from pipeline.ingest.offsets import OffsetRange, TopicPartition

log = logging.getLogger(__name__)


class LagMonitor:
    """Log-end offsets of the stream's partitions, refreshed in the background.

    Args:
        bootstrap: Kafka ``host:port``.
        topics: the topics whose partitions to watch.
        interval_s: seconds between refreshes.
        on_refresh: called after each refresh (from the monitor's thread).
        isolation_level: the stream's; with ``read_committed`` the log end is the last
            stable offset (what the stream can read), else the high watermark.
        kafka_conf: the Kafka client properties file (TLS, SASL), by path.
    """

    def __init__(
        self,
        bootstrap: str,
        topics: list[str],
        interval_s: float = 1.0,
        on_refresh: Callable[[], None] | None = None,
        isolation_level: str = "read_committed",
        kafka_conf: str | None = None,
    ) -> None:
        self.bootstrap, self.topics, self.interval_s = bootstrap, topics, interval_s
        self.conf = conf.load(kafka_conf)
        self.isolation_level = isolation_level
        self.on_refresh = on_refresh
        self.ends: dict[TopicPartition, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="lag-monitor", daemon=True)

    def start(self) -> LagMonitor:
        self._thread.start()
        return self

    def _loop(self) -> None:
        from kafka import TopicPartition

        from pipeline.ingest.kafka import client

        while not self._stop.is_set():
            # A fresh consumer each refresh (about once a second, off the batch's path).
            c = None
            try:
                c = client.consumer(
                    self.bootstrap, conf=self.conf
                )  # fails while the broker restarts: tried again
                tps = [
                    TopicPartition(t, p) for t in self.topics for p in client.partitions_for(c, t)
                ]
                found = client.end_offsets(
                    c, tps, timeout_s=5, isolation_level=self.isolation_level, conf=self.conf
                )
                self.ends = {(tp.topic, tp.partition): n for tp, n in found.items()}
                if self.on_refresh is not None:
                    self.on_refresh()
            except Exception as e:  # lag is a figure, never a reason to stop training
                log.debug("lag refresh failed: %s", e)
            finally:
                if c is not None:
                    c.close()
            self._stop.wait(self.interval_s)

    def lag(self, ranges: list[OffsetRange]) -> dict[TopicPartition, int]:
        """Log end minus each range's end, per topic partition whose end is known."""
        ends = self.ends
        return {
            r.topic_partition: max(0, ends[r.topic_partition] - r.end)
            for r in ranges
            if r.topic_partition in ends
        }

    def unread(self, ranges: list[OffsetRange]) -> dict[TopicPartition, int]:
        """Log end minus each range's start: the lag a batch that could not be read leaves
        (the range's end where the log end is not known yet)."""
        ends = self.ends
        return {
            r.topic_partition: max(ends.get(r.topic_partition, r.end), r.end) - r.start
            for r in ranges
        }

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
