"""Every Prometheus metric of streamtrain, declared once, each component in its own registry.

Names follow ``streamtrain_<component>_<what>_<unit>``; counters end in ``_total``.
A component makes its metrics with one call and serves them with
:func:`pipeline.observe.exposition.serve`; histograms take their bounds from
:mod:`~pipeline.observe.buckets`, refusal counters their reasons from
:mod:`~pipeline.observe.refusals`.
"""

from __future__ import annotations

import dataclasses

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pipeline.observe import buckets


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
        records_sent=Counter(
            "streamtrain_producer_records_sent_total",
            "Records acknowledged by Kafka.",
            ["topic", "dataset"],
            registry=reg,
        ),
        bytes_sent=Counter(
            "streamtrain_producer_bytes_sent_total",
            "Value bytes of acknowledged records.",
            ["topic", "dataset"],
            registry=reg,
        ),
        send_errors=Counter(
            "streamtrain_producer_send_errors_total",
            "Records Kafka did not acknowledge.",
            ["topic", "dataset"],
            registry=reg,
        ),
        malformed_rows=Counter(
            "streamtrain_producer_malformed_rows_total",
            "Input rows skipped because they could not be parsed or encoded, by reason.",
            ["dataset", "reason"],
            registry=reg,
        ),
        target_rate=Gauge(
            "streamtrain_producer_target_records_per_second",
            "The replay rate limit (0: unlimited).",
            ["topic"],
            registry=reg,
        ),
        epochs=Counter(
            "streamtrain_producer_epochs_total",
            "Complete passes over the dataset split.",
            ["topic", "dataset"],
            registry=reg,
        ),
    )


@dataclasses.dataclass(frozen=True)
class TrainingMetrics:
    """Metrics of the training driver (executors report theirs through it).

    Two kinds of counters. The run's (``records_trained``, ``batches``): a resumed trainer
    sets them to its checkpoint's totals before its /metrics serves a first scrape, so
    Prometheus sees them go on across a restart. Every other counter is this process's: it
    starts at 0 with each trainer and never jumps, so a restart is a counter reset, which
    ``rate()`` and ``increase()`` read right (a counter read as 0 and then set to a run's
    total would count that total again).
    """

    registry: CollectorRegistry
    records_ingested: Counter
    records_trained: Counter
    records_rejected: Counter
    records_aborted: Counter
    records_poisoned: Counter
    unreadable_batches: Counter
    batches: Counter
    batches_skipped: Counter
    batch_duration: Histogram
    last_batch_duration: Gauge
    consumer_lag: Gauge
    staleness: Histogram
    ps_request_duration: Histogram
    ps_refusals: Counter
    ps_broken_connections: Counter
    ps_short_rounds: Counter
    updates_applied: Counter
    clock: Gauge
    freshness: Gauge
    freshness_sampled: Histogram
    prequential_loss: Gauge
    prequential_accuracy: Gauge
    heldout_accuracy: Gauge
    heldout_time: Gauge
    worker_seconds: Counter
    last_batch_time: Gauge
    info: Gauge
    drift_detected: Counter
    drift_time: Gauge


def training_metrics() -> TrainingMetrics:
    """A fresh registry with the training driver's metrics."""
    reg = CollectorRegistry()
    return TrainingMetrics(
        registry=reg,
        records_ingested=Counter(
            "streamtrain_stream_records_ingested_total",
            "Records read from Kafka into micro-batches by this trainer process (from 0 at each "
            "start).",
            ["topic"],
            registry=reg,
        ),
        records_trained=Counter(
            "streamtrain_train_records_total",
            "Records trained on, in the whole run (a resumed trainer goes on from its checkpoint).",
            ["topic"],
            registry=reg,
        ),
        records_rejected=Counter(
            "streamtrain_stream_records_rejected_total",
            "Records set aside, by reason: rejected by the decoder (to the dead-letter topic), "
            "or rows of a run's file its replay could not send.",
            ["reason"],
            registry=reg,
        ),
        records_aborted=Counter(
            "streamtrain_stream_records_aborted_total",
            "Records of aborted transactions left unread (read_committed).",
            ["topic"],
            registry=reg,
        ),
        records_poisoned=Counter(
            "streamtrain_stream_records_poisoned_total",
            "Offsets of unreadable record batches passed over (--on-poison skip).",
            ["topic"],
            registry=reg,
        ),
        unreadable_batches=Counter(
            "streamtrain_stream_unreadable_batches_total",
            "Record batches the reader could not read (codec, record format, corrupt), "
            "which stopped the stream.",
            ["topic", "partition"],
            registry=reg,
        ),
        batches=Counter(
            "streamtrain_stream_batches_total",
            "Micro-batches applied, in the whole run "
            "(a resumed trainer goes on from its checkpoint).",
            registry=reg,
        ),
        batches_skipped=Counter(
            "streamtrain_stream_batches_skipped_total",
            "Replayed micro-batches skipped because the checkpoint already holds them.",
            registry=reg,
        ),
        batch_duration=Histogram(
            "streamtrain_stream_batch_duration_seconds",
            "Wall time of a micro-batch.",
            buckets=buckets.BATCH_SECONDS,
            registry=reg,
        ),
        last_batch_duration=Gauge(
            "streamtrain_stream_last_batch_duration_seconds",
            "Wall time of the last micro-batch.",
            registry=reg,
        ),
        consumer_lag=Gauge(
            "streamtrain_stream_consumer_lag_records",
            "Records in Kafka not yet trained, per partition.",
            ["topic", "partition"],
            registry=reg,
        ),
        staleness=Histogram(
            "streamtrain_ps_staleness_updates",
            "Updates applied between a worker's pull and push.",
            buckets=buckets.INTEGER,
            registry=reg,
        ),
        ps_request_duration=Histogram(
            "streamtrain_ps_request_duration_seconds",
            "Parameter-server request time on the server, by operation.",
            ["op"],
            buckets=buckets.PS_SECONDS,
            registry=reg,
        ),
        ps_refusals=Counter(
            "streamtrain_ps_refusals_total",
            "Connections and requests the parameter server refused, by reason.",
            ["reason"],
            registry=reg,
        ),
        ps_broken_connections=Counter(
            "streamtrain_ps_broken_connections_total",
            "Authenticated workers' connections cut mid-exchange (a killed executor or "
            "Python worker; no refusal).",
            registry=reg,
        ),
        ps_short_rounds=Counter(
            "streamtrain_ps_short_rounds_total",
            "Synchronous rounds closed without a straggler (its gradient joins a later round).",
            registry=reg,
        ),
        updates_applied=Counter(
            "streamtrain_ps_updates_total",
            "Updates the parameter server applied in this process.",
            registry=reg,
        ),
        clock=Gauge(
            "streamtrain_ps_clock_updates",
            "The parameter server's clock: updates applied since the run began "
            "(kept across resumes).",
            registry=reg,
        ),
        freshness=Gauge(
            "streamtrain_model_freshness_seconds",
            "Now minus the newest Kafka timestamp whose update the center holds "
            "(the oldest partition's).",
            registry=reg,
        ),
        # A family has one type: the histogram of the same figure takes a name of its own.
        freshness_sampled=Histogram(
            "streamtrain_model_freshness_sampled_seconds",
            "The model's freshness, sampled about once a second (time-weighted).",
            buckets=buckets.FRESHNESS_SECONDS,
            registry=reg,
        ),
        prequential_loss=Gauge(
            "streamtrain_train_prequential_loss",
            "Loss on each batch before training on it (test-then-train).",
            registry=reg,
        ),
        prequential_accuracy=Gauge(
            "streamtrain_train_prequential_accuracy",
            "Accuracy on each batch before training on it.",
            registry=reg,
        ),
        heldout_accuracy=Gauge(
            "streamtrain_eval_heldout_accuracy",
            "Accuracy of the center weights on the held-out test split.",
            registry=reg,
        ),
        heldout_time=Gauge(
            "streamtrain_eval_heldout_timestamp_seconds",
            "Unix time when the held-out score was measured (a resumed run publishes its last "
            "score and this time at once).",
            registry=reg,
        ),
        worker_seconds=Counter(
            "streamtrain_worker_seconds_total",
            "Worker time by activity (compute: forward and backward; exchange: pull and push).",
            ["activity"],
            registry=reg,
        ),
        last_batch_time=Gauge(
            "streamtrain_train_last_batch_timestamp_seconds",
            "Unix time when the last micro-batch was trained and checkpointed.",
            registry=reg,
        ),
        info=Gauge(
            "streamtrain_run_info",
            "The run's settings, as labels (value 1).",
            ["dataset", "algorithm", "topic", "workers"],
            registry=reg,
        ),
        # The run's: a resumed run goes on from the drifts its checkpoint lists.
        drift_detected=Counter(
            "streamtrain_drift_detected_total",
            "Drifts found in the stream, by signal (loss, prior, feature; docs/drift.md).",
            ["signal"],
            registry=reg,
        ),
        drift_time=Gauge(
            "streamtrain_drift_last_timestamp_seconds",
            "Unix time when the last drift was found (NaN: none yet).",
            registry=reg,
        ),
    )


@dataclasses.dataclass(frozen=True)
class ServingMetrics:
    """Metrics of a model server (``streamtrain serve``, ``run --serve-port``) and of the
    predict stream."""

    registry: CollectorRegistry
    requests: Counter
    bad_requests: Counter
    latency: Histogram
    instances: Histogram
    weights_age: Gauge
    model_version: Gauge
    predictions_written: Counter
    unknown_ids: Counter


def serving_metrics(model: str) -> ServingMetrics:
    """A fresh registry with a model server's metrics; ``model`` labels them."""
    reg = CollectorRegistry()
    return ServingMetrics(
        registry=reg,
        requests=Counter(
            "streamtrain_serve_requests_total",
            "Prediction API requests answered, by HTTP status.",
            ["model", "code"],
            registry=reg,
        ),
        bad_requests=Counter(
            "streamtrain_serve_bad_requests_total",
            "Requests refused for their content (a 4xx), by reason.",
            ["model", "reason"],
            registry=reg,
        ),
        latency=Histogram(
            "streamtrain_serve_request_seconds",
            "Seconds from a request's arrival to its answer.",
            ["model"],
            registry=reg,
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
        ),
        instances=Histogram(
            "streamtrain_serve_instances",
            "Instances per prediction request.",
            ["model"],
            registry=reg,
            buckets=buckets.INSTANCES,
        ),
        weights_age=Gauge(
            "streamtrain_serve_weights_age_seconds",
            "Age of the weights predictions use now (since the parameter server or the "
            "checkpoint held them).",
            ["model"],
            registry=reg,
        ),
        model_version=Gauge(
            "streamtrain_serve_model_version",
            "The parameter server's clock when the served weights were read.",
            ["model"],
            registry=reg,
        ),
        predictions_written=Counter(
            "streamtrain_predictions_written_total",
            "Predictions the predict stream wrote to its output topic.",
            ["topic"],
            registry=reg,
        ),
        unknown_ids=Counter(
            "streamtrain_serve_unknown_ids_total",
            "IDs in served instances without a row of their own yet (they read their table's "
            "shared row).",
            ["model"],
            registry=reg,
        ),
    )


__all__ = [
    "ProducerMetrics",
    "ServingMetrics",
    "TrainingMetrics",
    "producer_metrics",
    "serving_metrics",
    "training_metrics",
]
