"""Kafka: the embedded broker and client helpers that work on Tansu and real Kafka."""

from pipeline.ingest.kafka.broker import EmbeddedBroker, find_tansu, free_port, running_bootstrap
from pipeline.ingest.kafka.client import (
    check_reachable,
    consumer,
    end_offsets,
    ensure_topic,
    parse_bootstrap,
)

__all__ = [
    "EmbeddedBroker",
    "check_reachable",
    "consumer",
    "end_offsets",
    "ensure_topic",
    "find_tansu",
    "free_port",
    "parse_bootstrap",
    "running_bootstrap",
]
