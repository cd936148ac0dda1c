"""Producers: dataset readers and the replay producer. They need Kafka and the wire
format only, nothing of Spark or training."""

from producers import datasets
from producers.replay import Replay
from producers.report import ReplayReport

__all__ = ["Replay", "ReplayReport", "datasets"]
