"""Every Prometheus metric of streamtrain, declared once, each component in its own registry.

Names follow ``streamtrain_<component>_<what>_<unit>``; counters end in ``_total``.
A component makes its metrics with one call and serves them with :func:`serve`.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from pipeline.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ProducerMetrics:
    """Metrics of the replay producer."""

    registry: CollectorRegistry
    records_sent: Counter
    bytes_sent: Counter
    send_errors: Counter
    malformed_rows: Counter
    target_rate: Gauge
    epochs: Counter


def producer_metrics() -> ProducerMetrics:
    """A fresh registry with the replay producer's metrics."""
    reg = CollectorRegistry()
    return ProducerMetrics(
        registry=reg,
        records_sent=Counter("streamtrain_producer_records_sent_total",
                             "Records acknowledged by Kafka.", ["topic", "dataset"], registry=reg),
        bytes_sent=Counter("streamtrain_producer_bytes_sent_total",
                           "Value bytes of acknowledged records.", ["topic", "dataset"], registry=reg),
        send_errors=Counter("streamtrain_producer_send_errors_total",
                            "Records Kafka did not acknowledge.", ["topic", "dataset"], registry=reg),
        malformed_rows=Counter("streamtrain_producer_malformed_rows_total",
                               "Input rows skipped because they could not be parsed or encoded.",
                               ["dataset"], registry=reg),
        target_rate=Gauge("streamtrain_producer_target_records_per_second",
                          "The replay rate limit (0: unlimited).", ["topic"], registry=reg),
        epochs=Counter("streamtrain_producer_epochs_total",
                       "Complete passes over the dataset split.", ["topic", "dataset"], registry=reg),
    )


@dataclasses.dataclass
class MetricsServer:
    """A running /metrics endpoint; ``port`` is the bound port (useful with port 0)."""

    host: str
    port: int
    _server: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(registry: CollectorRegistry, *, host: str = "127.0.0.1", port: int = 0) -> MetricsServer:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread."""
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as e:
        raise ConfigError(
            f"Cannot serve /metrics on {host}:{port} ({e.strerror}). Pass another --metrics-port, or 0 for a free one."
        ) from None
    return MetricsServer(host, int(server.server_port), server, thread)
