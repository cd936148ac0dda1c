"""The one root exception of streamtrain; the CLI turns it into one line and exit 2."""

from __future__ import annotations


class StreamtrainError(Exception):
    """A failure the user can act on: the message says what was expected, what was
    received and what to do."""


class ConfigError(StreamtrainError, ValueError):
    """A bad option, setting or argument."""


class DataError(StreamtrainError):
    """A missing or unreadable data file."""


class BrokerError(StreamtrainError):
    """Kafka could not be reached or the embedded broker could not start."""
