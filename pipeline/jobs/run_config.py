"""The settings of one online run (``streamtrain run``'s options), checked before anything
starts (:mod:`~pipeline.jobs.run_checks`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.ingest.sizing import Sizing
from pipeline.jobs import run_checks
from pipeline.jobs.eval_cadence import EVAL_SHARE

#: Records per mini-batch (for sync, per round: the global batch) unless --batch-size says.
BATCH_SIZE = 128
#: The same for a user's table trained by the default model. A table's records are cheap to
#: compute and its MLP has few weights, so what a run lacks is steps, not throughput: at 128, a
#: 20,000-record concept (River's Agrawal) scored 0.67 prequential accuracy and penguins 0.59
#: to 0.92 after a pass; at 16, with TABLE_LEARNING_RATE, 0.97 and 0.99 to 1.0.
TABLE_BATCH_SIZE = 16
#: Adam's learning rate for the default table model (Keras's default, 1e-3, is one third).
TABLE_LEARNING_RATE = 3e-3


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Settings of one run (the CLI's options)."""

    dataset: str = "mnist"
    algorithm: str = "sync"
    workers: int = 2
    batch_size: int | None = None  # None: 128, or TABLE_BATCH_SIZE for a table on the default model
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
    broker_engine: str | None = None  # None: $STREAMTRAIN_BROKER_ENGINE, else kafka
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
    # The Kafka source: Spark's own (jvm), streamtrain's (python), or auto: resolved to one of
    # them when the run starts, before it is recorded (a resume reads with the same source).
    source: str = "auto"
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

    def __post_init__(self) -> None:
        if self.batch_size is None:
            default = TABLE_BATCH_SIZE if self.default_table_model else BATCH_SIZE
            object.__setattr__(self, "batch_size", default)

    @property
    def table(self) -> bool:
        """Whether the run trains a user's table (a file, or a topic by a schema)."""
        return bool(self.data or self.schema or self.label or self.format not in (None, "binary"))

    @property
    def default_table_model(self) -> bool:
        """Whether a user's table trains on the default MLP (TABLE_BATCH_SIZE and
        TABLE_LEARNING_RATE are its settings).

        >>> RunConfig(data="p.csv", label="y").default_table_model, RunConfig().default_table_model
        (True, False)
        """
        return self.table and not self.model

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

    @property
    def eval_share(self) -> float | None:
        """The share of the streaming time held-out scoring may take: bounded with a freshness
        target (its small batches), else None (every ``eval_every`` batches).

        >>> RunConfig(freshness_target_s=2.0).eval_share, RunConfig().eval_share
        (0.1, None)
        """
        return None if self.freshness_target_s is None else EVAL_SHARE

    def validate(self) -> None:
        """Raise :class:`~pipeline.errors.ConfigError` for the first bad setting
        (:func:`~pipeline.jobs.run_checks.check`)."""
        run_checks.check(self)
