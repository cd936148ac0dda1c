"""What a run trains on: a built-in dataset, a user's file, or a topic someone else feeds.

Each is a reader with a ``schema`` (how the stream decodes its records) and a held-out
``test`` split that scores the model: a built-in dataset's own; a file's fixed share of
rows (``--holdout``) or ``--eval-data FILE``'s rows; a topic's records whose key hashes into the
held-out share (never trained: the executors drop them), read at the start, or ``--eval-data FILE``.
No built-in dataset's test split ever scores a model it does not fit.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import codec, record_key
from pipeline.errors import ConfigError
from pipeline.jobs.run_config import RunConfig

log = logging.getLogger(__name__)

#: A file's share of held-out rows, and a topic's share of held-out keys, by default.
FILE_HOLDOUT = 0.1
TOPIC_HOLDOUT = 0.02
#: Records read from the start of a topic: to infer its schema, and for its held-out share.
SAMPLE_RECORDS = 50_000
#: A topic's default share holds out at least this many of the records it has at the start
#: (a small topic's 2% scores on a handful), up to :data:`MOST_HELD_OUT` of them.
HELD_OUT_FLOOR = 200
MOST_HELD_OUT = 0.2


def topic_share(sampled: int, given: float | None) -> float:
    """The share of a topic's keys held out: ``--holdout`` as given; else :data:`TOPIC_HOLDOUT`,
    raised for a small topic so that its start holds out :data:`HELD_OUT_FLOOR` records.

    >>> (
    ...     topic_share(100_000, None),
    ...     topic_share(1_500, None),
    ...     topic_share(300, None),
    ...     topic_share(1_500, 0.01),
    ... )
    (0.02, 0.1333, 0.2, 0.01)
    """
    if given is not None:
        return given
    if sampled <= 0:
        return TOPIC_HOLDOUT
    return max(TOPIC_HOLDOUT, min(MOST_HELD_OUT, round(HELD_OUT_FLOOR / sampled, 4)))


def resolve(cfg: RunConfig, data_dir: Path) -> Any:
    """The run's data reader (a :class:`producers.datasets.Dataset`, or a :class:`TopicTable`)."""
    from producers import datasets

    if cfg.data:
        # With --eval-data every row of the file trains, and the other file's rows score.
        table = datasets.Table(
            cfg.data,
            label=cfg.label,
            schema=cfg.schema,
            holdout=0.0 if cfg.eval_data else FILE_HOLDOUT if cfg.holdout is None else cfg.holdout,
            format=None if cfg.format in (None, "binary") else cfg.format,
        )
        if cfg.eval_data:
            table.eval_rows = datasets.Table(
                cfg.eval_data, schema=table.table, holdout=0.0, name=table.name
            )
        return table
    if cfg.table:
        assert cfg.topic and cfg.bootstrap, "RunConfig.validate checks a table's source"
        return TopicTable(cfg)
    return datasets.get(cfg.dataset, data_dir=data_dir)


def contract(schema: Any) -> dict[str, Any]:
    """What the model must take and give for this data (checked when it is described)."""
    if schema.table is not None:
        what = (
            f"{schema.name}'s numeric target ({schema.n_features} encoded columns)"
            if schema.regression
            else f"{schema.name}'s {schema.num_classes} classes ({schema.n_features} encoded "
            "columns)"
        )
        return {
            "input": list(schema.input_shape),
            "outputs": max(1, schema.num_classes),
            "what": what,
        }
    return {
        "input": list(schema.input_shape),
        "outputs": schema.num_classes,
        "what": f"{schema.name} ({schema.num_classes} classes)",
    }


def replay_job(data: Any) -> dict[str, Any] | None:
    """A user's file, for the replay's process to read (None: a built-in dataset)."""
    table = getattr(data, "table", None)
    if table is None or not hasattr(data, "path"):
        return None
    return {
        "path": str(data.path),
        "schema": table.to_dict(),
        "holdout": data.holdout,
        "name": data.name,
    }


class TopicTable:
    """A topic of a user's records, read by a schema (given, or inferred from its first records).

    Its ``test`` split: ``--eval-data FILE`` (every row), else the records among the
    topic's first :data:`SAMPLE_RECORDS` whose key falls in the held-out share.
    """

    def __init__(self, cfg: RunConfig) -> None:
        from pipeline.table import TableSchema

        self.cfg, self.name = cfg, cfg.name
        fmt = cfg.format if cfg.format not in (None, "binary") else None
        self._sample: list[tuple[bytes | None, bytes | None, int]] | None = None
        if cfg.schema:
            table = TableSchema.load(cfg.schema)
            if fmt and fmt != table.format or cfg.schema_registry:
                table = table.with_format(fmt or table.format, registry=cfg.schema_registry)
            if (
                table.registry and table.registry != cfg.schema_registry
            ):  # the file's: checked as the option is
                from pipeline.table.registry import check_reachable

                check_reachable(table.registry)
        else:
            table = self._infer(fmt or "json")
        self.table = table
        self.share = topic_share(
            0 if cfg.eval_data or cfg.holdout is not None else len(self._records()), cfg.holdout
        )
        if cfg.holdout is None and self.share > TOPIC_HOLDOUT:
            log.info(
                "holding out %.1f%% of %s's keys: %d records at its start, at least %d of them "
                "held out",
                100 * self.share,
                cfg.topic,
                len(self._records()),
                HELD_OUT_FLOOR,
            )
        self.schema = dataclasses.replace(
            codec.table(self.name, table), holdout=0.0 if cfg.eval_data else self.share
        )

    def _records(self) -> list[tuple[bytes | None, bytes | None, int]]:
        if self._sample is None:
            self._sample = sample_topic(
                self.cfg.bootstrap or "",
                self.cfg.topic or "",
                SAMPLE_RECORDS,
                kafka_conf=self.cfg.kafka_conf,
            )
        return self._sample

    def _infer(self, fmt: str) -> Any:
        from pipeline.table import infer
        from pipeline.table.records import json_columns

        if fmt != "json":
            raise ConfigError(
                f"Expected --schema FILE for {fmt} records: a run infers a schema from JSON "
                f"records only. Write one with `streamtrain schema infer --topic {self.cfg.topic} "
                f"--bootstrap B --format {fmt} --label COLUMN -o schema.json`"
                + (
                    " (with --schema-registry URL, or --avro-schema WRITER.avsc)"
                    if fmt == "avro"
                    else ""
                )
                + ", then pass --schema schema.json."
            )
        columns = json_columns([value for _, value, _ in self._records()[:10_000]])
        if not columns:
            raise ConfigError(
                f"Expected JSON objects in topic {self.cfg.topic!r} to infer a schema from. "
                f"Received {len(self._records())} records, none of them one. Pass --schema FILE."
            )
        log.info("schema inferred from the first records of %s", self.cfg.topic)
        return infer(columns, label=self.cfg.label, format="json")

    def load(self, split: str = "test") -> Any:
        """The held-out records, transformed (``split`` is ``test``: a topic has no other)."""
        from producers import datasets

        if self.cfg.eval_data:
            return datasets.Table(
                self.cfg.eval_data,
                schema=self.table.with_format("json"),
                holdout=0.0,
                name=self.name,
            ).load("train")
        records = self._records()
        keys = [k for k, _, _ in records]
        offsets = np.array([o for _, _, o in records], np.int64)
        held = record_key.held_out(keys, offsets, self.share)
        decoded = self.table.decode([v for (_, v, _), h in zip(records, held, strict=True) if h])
        log.info(
            "held-out scores on %d records of %s (the %.0f%% of keys never trained)",
            len(decoded.y),
            self.cfg.topic,
            100 * self.share,
        )
        return datasets.Chunk(np.arange(len(decoded.y), dtype=np.uint64), decoded.x, decoded.y)

    def describe(self) -> dict[str, Any]:
        return {
            "topic": self.cfg.topic,
            "holdout": self.share,
            "eval_data": self.cfg.eval_data,
            "schema": self.table.to_dict(),
        }


def sample_topic(
    bootstrap: str,
    topic: str,
    limit: int,
    *,
    timeout_s: float = 60.0,
    kafka_conf: str | None = None,
) -> list[tuple[bytes | None, bytes | None, int]]:
    """Up to ``limit`` records ``(key, value, offset)`` from the start of every partition of
    ``topic`` (a Kafka secured as the client properties file ``kafka_conf`` says)."""
    from kafka import TopicPartition

    from pipeline.ingest.kafka import client, conf

    secured = conf.load(kafka_conf)
    client.check_reachable(
        bootstrap, conf=secured
    )  # a refused login is one line, not kafka-python's retries
    c = client.consumer(bootstrap, conf=secured)
    try:
        parts = [TopicPartition(topic, p) for p in client.partitions_for(c, topic)]
        if not parts:
            raise ConfigError(f"Expected topic {topic!r} at {bootstrap}; it does not exist (yet).")
        c.assign(parts)
        c.seek_to_beginning(*parts)
        ends = client.end_offsets(c, parts, conf=secured)
        want = min(limit, sum(ends.values()))
        out: list[tuple[bytes | None, bytes | None, int]] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < want and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=500).values():
                out.extend((r.key, r.value, r.offset) for r in records)
        return out[:limit]
    finally:
        c.close()
