"""Writer schemas by id from a Confluent Schema Registry, for Avro in its wire format.

The lookup is confluent-kafka's own client (``pip install 'streamtrain[registry]'``),
which also gives a ``mock://`` registry for tests. Each id is asked for once per
process: records name their writer's schema by id, and ids never change meaning.
"""

from __future__ import annotations

import time
from typing import Any

from pipeline.errors import ConfigError

#: Seconds a registry has to answer before a run or ``schema infer`` gives up on it.
REACH_TIMEOUT_S = 5.0

_BY_URL: dict[str, Registry] = {}


class Registry:
    """Resolves Confluent schema ids to parsed Avro schemas.

    Args:
        client: a ``confluent_kafka.schema_registry.SchemaRegistryClient`` (or its mock).
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self._schemas: dict[int, Any] = {}

    @classmethod
    def for_url(cls, url: str | None) -> Registry:
        """The registry at ``url``, one client per process."""
        if not url:
            raise ConfigError(
                "Expected --schema-registry URL for Avro records in the Confluent wire format."
            )
        if url not in _BY_URL:
            _BY_URL[url] = cls(client(url))
        return _BY_URL[url]

    def writer_schema(self, schema_id: int) -> Any:
        """The parsed Avro schema with this id, or None if the registry has none (or is not
        Avro)."""
        if schema_id not in self._schemas:
            import json

            from fastavro import parse_schema

            try:
                found = self.client.get_schema(schema_id)
            except Exception:  # the client's SchemaRegistryError (404) and transport errors alike
                return None
            if (getattr(found, "schema_type", None) or "AVRO") != "AVRO":
                return None
            self._schemas[schema_id] = parse_schema(json.loads(found.schema_str))
        return self._schemas[schema_id]

    def latest(self, subject: str) -> tuple[int, dict[str, Any]] | None:
        """The newest schema under ``subject`` (``TOPIC-value``): its id and Avro JSON."""
        import json

        try:
            found = self.client.get_latest_version(subject)
        except Exception:
            return None
        return int(found.schema_id), json.loads(found.schema.schema_str)


def client(url: str) -> Any:
    """confluent-kafka's registry client for ``url`` (``mock://NAME``: its in-process mock),
    bounded in time: its own default retries a dead address for minutes."""
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError:
        raise ConfigError(
            "Expected confluent-kafka's Schema Registry client for --schema-registry. "
            "Install it: pip install 'streamtrain[registry]'."
        ) from None
    return SchemaRegistryClient.new_client(
        {"url": url, "timeout": REACH_TIMEOUT_S, "max.retries": 1}
    )


def check_reachable(url: str, *, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Raise one :class:`ConfigError` line, within ``timeout_s``, where nothing answers at
    ``url`` (any HTTP answer, an error status included, is a registry that is there).

    >>> check_reachable("mock://anything")
    >>> check_reachable("http://127.0.0.1:9", timeout_s=2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: Expected a Schema Registry at http://127.0.0.1:9; ...
    """
    if url.startswith("mock://"):
        return
    import urllib.error
    import urllib.request

    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"Expected --schema-registry as http(s)://HOST:PORT. Received: {url!r}")
    started = time.monotonic()
    try:
        urllib.request.urlopen(f"{url.rstrip('/')}/subjects", timeout=timeout_s).close()  # noqa: S310 -- http(s) only
    except urllib.error.HTTPError:
        return  # it answered (a 401 is a registry that wants credentials: the client's affair)
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError(
            f"Expected a Schema Registry at {url}; none answered within "
            f"{time.monotonic() - started:.0f} s ({reason}). Check --schema-registry (or the "
            'schema file\'s "registry") and that the registry is up.'
        ) from None
