"""The /metrics endpoint: a component's registry served over HTTP from a daemon thread, and
a wait for the scrape that carries its last figures before the process exits.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from pipeline.errors import ConfigError


class _ScrapeClock:
    """A collector that exports nothing and remembers when it was last collected (scraped)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def collect(self) -> list[Any]:
        self.times = [*self.times[-1:], time.monotonic()]  # the last two: their gap is the interval
        return []


@dataclasses.dataclass
class MetricsServer:
    """A running /metrics endpoint; ``port`` is the bound port (useful with port 0)."""

    host: str
    port: int
    _server: Any
    _thread: threading.Thread
    _scrapes: _ScrapeClock

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def await_scrape(self, *, max_wait_s: float = 30.0) -> bool:
        """Wait for one more scrape, if something scrapes this endpoint, so the last figures
        reach Prometheus before the process exits; return whether one came.

        Nobody scraped yet: return at once. Else wait up to two scrape intervals (as last
        seen), ``max_wait_s`` at most.
        """
        seen = list(self._scrapes.times)
        if not seen:
            return False
        interval = seen[1] - seen[0] if len(seen) == 2 else 15.0
        deadline = time.monotonic() + min(max_wait_s, 2 * interval + 1)
        while time.monotonic() < deadline:
            if self._scrapes.times[-1] > seen[-1]:
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(registry: CollectorRegistry, *, host: str = "127.0.0.1", port: int = 0) -> MetricsServer:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread."""
    scrapes = _ScrapeClock()
    registry.register(scrapes)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        registry.unregister(scrapes)
        raise ConfigError(
            f"Cannot serve /metrics on {host}:{port} ({e.strerror}). "
            "Pass another --metrics-port, or 0 for a free one."
        ) from None
    return MetricsServer(host, int(server.server_port), server, thread, scrapes)
