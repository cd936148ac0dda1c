"""Writer schemas by id from a Confluent Schema Registry, for Avro in its wire format.

The lookup is confluent-kafka's own client (``pip install 'streamtrain[registry]'``),
which also gives a ``mock://`` registry for tests. Each id is asked for once per
process: records name their writer's schema by id, and ids never change meaning.
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import ConfigError

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
            raise ConfigError("Expected --schema-registry URL for Avro records in the Confluent wire format.")
        if url not in _BY_URL:
            _BY_URL[url] = cls(client(url))
        return _BY_URL[url]

    def writer_schema(self, schema_id: int) -> Any:
        """The parsed Avro schema with this id, or None if the registry has none (or is not Avro)."""
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
    """confluent-kafka's registry client for ``url`` (``mock://NAME``: its in-process mock)."""
    try:
        from confluent_kafka.schema_registry import SchemaRegistryClient
    except ImportError:
        raise ConfigError("Expected confluent-kafka's Schema Registry client for --schema-registry. "
                          "Install it: pip install 'streamtrain[registry]'.") from None
    return SchemaRegistryClient.new_client({"url": url})
