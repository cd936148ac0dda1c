"""The settings of one online run (``streamtrain run``'s options), checked before anything
starts."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.ingest.sizing import Sizing


def _builtin_datasets() -> tuple[str, ...]:
    from producers import datasets

    return datasets.BUILTIN


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Settings of one run (the CLI's options)."""

    dataset: str = "mnist"
    algorithm: str = "sync"
    workers: int = 2
    batch_size: int = 128
    communication_window: int | None = None  # None: the algorithm's own
    sync_overlap: bool = False  # sync: push each gradient while the next computes (one round stale)
    epochs: int = 1
    rate: float | None = None
    until_accuracy: float | None = None
    max_batches: int | None = None
    timeout_s: float | None = None
    bootstrap: str | None = None
    kafka_conf: str | None = (
        None  # a Kafka client properties file (TLS, SASL): only its path is kept
    )
    broker_engine: str | None = None  # None: $STREAMTRAIN_BROKER_ENGINE, else tansu
    topic: str | None = None
    own_topic: str | None = (
        None  # the topic of the run's own replay into a --bootstrap Kafka (named at its start)
    )
    master: str = "local[*]"
    spark_conf: str | None = (
        None  # a Spark properties file (the cluster's security settings, and any other)
    )
    model: str | None = None
    out: str | None = None
    resume: bool = False
    generation: int | None = None  # with resume: go back to this kept checkpoint (its batch id)
    keep_checkpoints: int = 3  # checkpoint generations kept beside state.npz
    max_offsets_per_trigger: int = (
        20_000  # a batch's size; with a freshness target, its upper bound
    )
    freshness_target_s: float | None = (
        None  # size each batch for the model to stay this fresh (None: fixed size)
    )
    min_offsets_per_trigger: int | None = (
        None  # with a freshness target, a batch's lower bound (None: 1,000 or less)
    )
    on_poison: str = "fail"  # a batch the reader cannot read: stop (fail) or pass over it (skip)
    divergence_check: bool = True  # stop a run whose held-out score collapses
    wire_dtype: str = (
        "float32"  # deltas and weights on TCP: float32, bfloat16 or float16 (half the bytes)
    )
    ps_shards: int = (
        1  # parameter-server processes, each serving a slice of the weights (1: one, in the driver)
    )
    isolation_level: str = (
        "read_committed"  # Kafka's; read_uncommitted also trains aborted transactions
    )
    eval_every: int = 5
    eval_max: int = 10_000
    metrics_port: int = 0
    producer_metrics_port: int = 0
    data_dir: str | None = None
    seed: int | None = None
    serve_port: int | None = (
        None  # serve predictions from the live weights on this port (0: a free one)
    )
    serve_max_age_s: float = 1.0  # refuse to predict with weights older than this
    # A user's data (issue "your data"): a file, or a topic fed by someone else, by a schema.
    data: str | None = (
        None  # a CSV, JSON lines or Parquet file to replay instead of a built-in dataset
    )
    label: str | None = None  # the target column (to infer a schema)
    schema: str | None = None  # a schema file (streamtrain schema infer writes one)
    format: str | None = (
        None  # the records' format on the topic: binary (built-in), json, csv, avro
    )
    holdout: float | None = None  # the share held out for scores (a file's rows; a topic's keys)
    eval_data: str | None = None  # a file of held-out records instead
    schema_registry: str | None = None  # Avro in the Confluent wire format: the registry's URL
    max_rejected: float | None = (
        None  # the share of records rejected that stops the run (None: REJECTED_SHARE)
    )
    on_drift: str = (
        "alert"  # when the stream drifts: say so (alert), or say so and adapt (docs/drift.md)
    )
    drift: str | None = (
        None  # the drift signals' settings, KEY=VALUE,... (pipeline.train.drift.DriftSettings)
    )

    @property
    def table(self) -> bool:
        """Whether the run trains a user's table (a file, or a topic by a schema)."""
        return bool(self.data or self.schema or self.label or self.format not in (None, "binary"))

    @property
    def name(self) -> str:
        """The data's name: the built-in dataset, the file's stem, or the topic.

        >>> RunConfig(data="data/penguins.csv").name, RunConfig(topic="t", format="json").name
        ('penguins', 't')
        """
        if self.data:
            return Path(self.data).name.split(".")[0]
        if self.table and self.topic:
            return self.topic
        return self.dataset

    def report_settings(self) -> dict[str, object]:
        """The settings as the report shows them: a user's table trains no built-in dataset.

        >>> RunConfig(data="data/penguins.csv", label="species").report_settings()[
        ...     "dataset"
        ... ] is None
        True
        >>> RunConfig().report_settings()["dataset"]
        'mnist'
        """
        settings = dataclasses.asdict(self)
        if self.table:
            settings["dataset"] = None
        return settings

    @property
    def sizing(self) -> Sizing | None:
        """How batches are sized: for ``--freshness-target`` within the bounds, or None (a
        fixed ``--max-offsets-per-trigger``).

        >>> RunConfig(freshness_target_s=2.0).sizing
        Sizing(target_s=2.0, min_rows=1000, max_rows=20000, share=0.5)
        >>> RunConfig(freshness_target_s=2.0, max_offsets_per_trigger=400).sizing.min_rows
        400
        >>> RunConfig().sizing is None
        True
        """
        if self.freshness_target_s is None:
            return None
        low = self.min_offsets_per_trigger
        # Unset, the lower bound gives way to a lower upper bound rather than refuse it.
        low = min(1_000, self.max_offsets_per_trigger) if low is None else low
        return Sizing(self.freshness_target_s, low, self.max_offsets_per_trigger)

    def validate(self) -> None:
        """Raise :class:`~pipeline.errors.ConfigError` for the first bad setting."""
        names = _builtin_datasets()
        if self.dataset not in names:
            raise ConfigError(f"Expected --dataset in {names}. Received: {self.dataset!r}")
        self._check_table()
        for name in (
            "workers",
            "batch_size",
            "communication_window",
            "epochs",
            "max_offsets_per_trigger",
            "eval_every",
            "ps_shards",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"Expected --{name.replace('_', '-')} >= 1. Received: {value}")
        if self.freshness_target_s is not None:
            self.sizing  # noqa: B018 - a target and bounds that cannot work: one line now, before anything starts
        if self.sync_overlap and self.algorithm != "sync":
            raise ConfigError(
                "--sync-overlap is synchronous SGD's alone (--algorithm sync). Received: "
                f"--algorithm {self.algorithm}. Drop --sync-overlap."
            )
        if self.on_drift not in ("alert", "adapt"):
            raise ConfigError(
                f"Expected --on-drift alert or adapt. Received: {self.on_drift!r}. See "
                "docs/drift.md."
            )
        from pipeline.train.drift import DriftSettings

        DriftSettings.parse(self.drift)
        if self.wire_dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(
                f"Expected --wire-dtype float32, bfloat16 or float16. Received: {self.wire_dtype!r}"
            )
        if self.max_rejected is not None and not 0 <= self.max_rejected <= 1:
            raise ConfigError(
                f"Expected --max-rejected in [0, 1] (a share of the records read). "
                f"Received: {self.max_rejected}"
            )
        if self.on_poison not in ("fail", "skip"):
            raise ConfigError(f"Expected --on-poison fail or skip. Received: {self.on_poison!r}")
        if self.isolation_level not in ("read_committed", "read_uncommitted"):
            raise ConfigError(
                "Expected --isolation-level read_committed or read_uncommitted. "
                f"Received: {self.isolation_level!r}"
            )
        if self.until_accuracy is not None and not 0 < self.until_accuracy <= 1:
            raise ConfigError(
                f"Expected --until-accuracy in (0, 1]. Received: {self.until_accuracy}"
            )
        if self.serve_port is not None:
            from pipeline import config
            from pipeline.serve.process import check_serving, host_and_token

            host, _ = host_and_token(config.settings())
            check_serving(self.serve_port, self.serve_max_age_s, host=host)
        if self.kafka_conf:
            if not self.bootstrap:
                raise ConfigError(
                    "Expected --bootstrap HOST:PORT (or bootstrap.servers in the file) with "
                    f"--kafka-conf {self.kafka_conf}: the embedded broker is PLAINTEXT on "
                    "loopback and needs none."
                )
            from pipeline.ingest.kafka import conf

            conf.load(self.kafka_conf)  # a bad file is one line now, not a failed task later
        if self.master.startswith("spark://"):
            self._check_cluster()
        from pipeline.cluster import jvmcache

        jvmcache.check_java()  # before the broker and the replay start, not once Spark fails
        if self.resume and not self.out:
            raise ConfigError("--resume needs the run's output folder.")
        if self.generation is not None and not self.resume:
            raise ConfigError(
                f"--generation {self.generation} needs --resume DIR, the run to go back in."
            )
        if self.keep_checkpoints < 1:
            raise ConfigError(
                f"Expected --keep-checkpoints >= 1. Received: {self.keep_checkpoints}"
            )
        if self.model is not None:
            from pipeline.train.probe import check_source

            check_source(self.model)

    def _check_table(self) -> None:
        """A user's data: a file, or a topic someone else feeds, and how to read it."""
        if self.format not in (None, "binary", "json", "csv", "avro"):
            raise ConfigError(
                f"Expected --format binary, json, csv or avro. Received: {self.format!r}"
            )
        if self.holdout is not None and not 0 <= self.holdout < 1:
            raise ConfigError(f"Expected --holdout in [0, 1). Received: {self.holdout}")
        if not self.table:
            return
        if self.data and self.topic and self.bootstrap:
            raise ConfigError(
                "Pass --data (a file to replay) or --topic with --bootstrap (a topic fed by "
                "someone else), not both."
            )
        if not self.data and not (self.topic and self.bootstrap):
            raise ConfigError(
                "Expected --data FILE, or --topic T with --bootstrap B, for "
                "--label/--schema/--format (a built-in dataset takes none of them)."
            )
        if not self.schema and not self.label:
            raise ConfigError(
                "Expected --label COLUMN (the target, to infer a schema) or --schema FILE."
            )
        for path, option in (
            (self.data, "--data"),
            (self.schema, "--schema"),
            (self.eval_data, "--eval-data"),
        ):
            if path and not Path(path).is_file():
                raise ConfigError(
                    f"Expected a file for {option}. Received: {path}, which does not exist."
                )
        if self.schema_registry:
            from pipeline.table.registry import check_reachable

            check_reachable(
                self.schema_registry
            )  # one line in seconds, before Kafka and Spark start

    def _check_cluster(self) -> None:
        """A standalone cluster: its security settings, and a Kafka its executors can reach."""
        from pipeline import config
        from pipeline.cluster import reach, security

        security.spark_conf(self.master, self.spark_conf)
        reach.check_master(
            self.master, wait_s=config.settings().master_wait_s
        )  # before the broker and the replay
        if not self.bootstrap and not security.on_loopback(self.master):
            raise ConfigError(
                f"Expected --bootstrap HOST:PORT for the cluster at {self.master}: its executors "
                "read Kafka, and the embedded broker listens on this machine's loopback only."
            )
