"""Releasing trained records from a topic the run owns, so the broker's memory stays bounded.

An embedded broker holds every record it is sent, in memory, until it stops: a replay
of N epochs grows it by N times the dataset. Once Spark has committed a micro-batch,
nothing reads its records again (a restart resumes after the last commit), so the run
deletes them (Kafka's DeleteRecords): the broker then holds what is not trained yet.
Only for a topic the run created on a broker it started: another Kafka's topics are
other people's data.

A broker without DeleteRecords (Tansu drops the connection; the run does not ask it)
is told once in the log and left alone.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pipeline.errors import BrokerError
from pipeline.ingest.kafka.security import PLAINTEXT, KafkaConf
from pipeline.ingest.offsets import OffsetRange

log = logging.getLogger(__name__)


class Releaser:
    """Deletes records below given offsets in a background thread; :meth:`close` stops it.

    :meth:`trained` takes each batch's ranges as it is saved and releases those of the
    batch before it (by then Spark has committed that one), so the call never waits on
    Kafka, and requests that pile up are merged into the latest.
    """

    def __init__(self, bootstrap: str, topic: str, *, conf: KafkaConf = PLAINTEXT) -> None:
        self.bootstrap, self.topic, self.conf = bootstrap, topic, conf
        self.released: dict[int, int] = {}  # partition -> the records below this offset are deleted
        self.supported = True
        self._previous: dict[int, int] = {}  # the last saved batch's ends
        self._wanted: dict[int, int] = {}
        self._busy = False
        self._closed = False
        self._lock = threading.Condition()
        self._admin: Any = None
        self._thread = threading.Thread(target=self._loop, name="release-trained", daemon=True)
        self._thread.start()

    def trained(self, ranges: list[OffsetRange]) -> None:
        """A batch covering ``ranges`` is saved: release what the batch before it covered."""
        with self._lock:
            for partition, end in self._previous.items():
                self._wanted[partition] = max(end, self._wanted.get(partition, 0))
            for r in ranges:
                if r.topic == self.topic:
                    self._previous[r.partition] = max(r.end, self._previous.get(r.partition, 0))
            self._lock.notify_all()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until every release asked for is done (or refused); False on timeout."""
        with self._lock:
            return self._lock.wait_for(
                lambda: not self.supported or not (self._wanted or self._busy), timeout=timeout_s
            )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join(timeout=15)
        if self._admin is not None:
            self._admin.close()

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._closed or (bool(self._wanted) and self.supported))
                if self._closed:
                    return
                wanted = {p: o for p, o in self._wanted.items() if o > self.released.get(p, 0)}
                # A failed release is asked for again, further on, by the next batch.
                self._wanted.clear()
                self._busy = True
            ok = not wanted or self._delete(wanted)
            with self._lock:
                if ok:
                    self.released.update(wanted)
                self._busy = False
                self._lock.notify_all()

    def _delete(self, wanted: dict[int, int]) -> bool:
        from kafka import TopicPartition
        from kafka.errors import KafkaError

        from pipeline.ingest.kafka import client

        try:
            if self._admin is None:
                self._admin = client.admin(
                    self.bootstrap, conf=self.conf, request_timeout_ms=10_000
                )
            self._admin.delete_records(
                {TopicPartition(self.topic, p): o for p, o in wanted.items()}
            )
            return True
        except (KafkaError, OSError, BrokerError) as e:
            # Tansu drops the connection: it has no DeleteRecords. Another error may pass;
            # the next batch's release asks again, for more.
            if "disconnected" in str(e).lower() or "unsupported" in type(e).__name__.lower():
                with self._lock:
                    self.supported = False
                log.info(
                    "this broker keeps the records it was sent (it cannot delete them: %s): its "
                    "memory grows with the replay",
                    type(e).__name__,
                )
            else:
                log.warning(
                    "could not release trained records of %s: %s: %s",
                    self.topic,
                    type(e).__name__,
                    e,
                )
            return False
