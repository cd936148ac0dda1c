"""The dashboard's panels, declared once: what each shows and the Prometheus queries behind
it, row by row (:mod:`~pipeline.observe.dashboard` builds them into Grafana's JSON).

Queries are right for each kind of counter (:class:`~pipeline.observe.metrics.TrainingMetrics`):
rates of the run's counters and of this process's both read true across a restart (the
first go on from the checkpoint, the others start at 0, a reset ``rate()`` handles); a
counter shown as a value is this process's and says so.
"""

from __future__ import annotations

import dataclasses

_RATE = "[$__rate_interval]"


@dataclasses.dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclasses.dataclass(frozen=True)
class Panel:
    """One panel: ``kind`` is ``timeseries`` or ``stat``; ``width`` is out of 24 columns."""

    title: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 8
    description: str = ""
    #: ``(value, color)`` steps above the base color (green, or ``base``), as Grafana's thresholds.
    thresholds: tuple[tuple[float, str], ...] = ()
    base: str = "green"
    no_value: str = ""


def _rate(metric: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return f"sum{grouping} (rate({metric}{_RATE}))"


def _quantile(q: float, metric: str, by: str = "") -> str:
    keys = f"le, {by}" if by else "le"
    # ">= 0" drops the NaN of a window without observations (an idle run): a gap, not "NaN".
    return f"histogram_quantile({q}, sum by ({keys}) (rate({metric}_bucket{_RATE}))) >= 0"


_IDLE = "idle: nothing observed in the last minute"
#: The predict stream's row, collapsed: the compose stack runs no predict stream, and an open
#: row of empty panels reads as something broken.
PREDICT_ROW = "Predict stream (streamtrain predict)"
#: The ID tables' row, collapsed: only a schema with ID features fills it.
TABLES_ROW = "ID tables (embedding rows on the parameter server)"
#: Rows Grafana shows closed.
COLLAPSED = frozenset({PREDICT_ROW, TABLES_ROW})


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    (
        "At a glance",
        (
            Panel(
                "Trained records/s",
                (Query(_rate("streamtrain_train_records_total"), "trained/s"),),
                kind="stat",
                width=4,
                base="red",
                thresholds=((1, "green"),),
                description="Over the last minute at least (several micro-batches); red: nothing "
                "trained.",
            ),
            Panel(
                "Consumer lag",
                (Query("sum(streamtrain_stream_consumer_lag_records)", "records"),),
                kind="stat",
                width=3,
                thresholds=((10_000, "orange"), (100_000, "red")),
                description="Records in Kafka not yet trained, all partitions "
                "(StreamtrainLagGrowing from 10,000 and rising).",
            ),
            Panel(
                "Held-out accuracy",
                (Query("max(streamtrain_eval_heldout_accuracy)", "accuracy"),),
                unit="percentunit",
                kind="stat",
                width=4,
                base="red",
                thresholds=((0.5, "orange"), (0.8, "green")),
                no_value="not scored yet",
                description="The last score measured (a resumed trainer shows its last one at "
                "once; its age is beside it).",
            ),
            Panel(
                "Held-out score age",
                (Query("time() - max(streamtrain_eval_heldout_timestamp_seconds) >= 0", "age"),),
                unit="s",
                kind="stat",
                width=3,
                thresholds=((600, "orange"), (3600, "red")),
                no_value="not scored yet",
                description="Seconds since the held-out score was measured (every --eval-every "
                "batches).",
            ),
            Panel(
                "Staleness p99",
                (Query(_quantile(0.99, "streamtrain_ps_staleness_updates"), "updates"),),
                kind="stat",
                width=3,
                thresholds=((16, "orange"), (32, "red")),
                no_value=_IDLE,
                description="Red from 32, where StreamtrainStalenessHigh fires.",
            ),
            Panel(
                "Since last batch",
                (
                    Query(
                        "time() - max(streamtrain_train_last_batch_timestamp_seconds) >= 0", "age"
                    ),
                ),
                unit="s",
                kind="stat",
                width=4,
                thresholds=((60, "orange"), (120, "red")),
                no_value="no batch yet",
                description="Seconds since a micro-batch was last trained (a resumed run: since "
                "its checkpoint was written).",
            ),
            Panel(
                "Rejected records",
                (Query("sum(streamtrain_stream_records_rejected_total)", "rejected"),),
                kind="stat",
                width=3,
                thresholds=((1, "orange"),),
                description="Set aside to the dead-letter topic since this trainer started.",
            ),
        ),
    ),
    (
        "Is data flowing?",
        (
            Panel(
                "Records per second: produced, ingested, trained",
                (
                    Query(
                        _rate("streamtrain_producer_records_sent_total", "topic"),
                        "produced {{topic}}",
                    ),
                    Query(
                        _rate("streamtrain_stream_records_ingested_total", "topic"),
                        "ingested {{topic}}",
                    ),
                    Query(_rate("streamtrain_train_records_total", "topic"), "trained {{topic}}"),
                    Query(
                        "max(streamtrain_stream_arrival_records_per_second)", "the stream brings"
                    ),
                ),
                unit="short",
                width=12,
                description="The stream brings: records read plus the lag's growth over the last "
                "30 s of batches, whoever produces them; above trained, the run falls behind.",
            ),
            Panel(
                "Consumer lag per partition",
                (Query("streamtrain_stream_consumer_lag_records", "{{topic}}-{{partition}}"),),
                unit="short",
                width=12,
                description="Log end offset minus the end of the last trained batch.",
            ),
            Panel(
                "Micro-batch duration",
                (
                    Query("streamtrain_stream_last_batch_duration_seconds", "last batch"),
                    Query(_quantile(0.5, "streamtrain_stream_batch_duration_seconds"), "p50"),
                    Query(_quantile(0.99, "streamtrain_stream_batch_duration_seconds"), "p99"),
                ),
                unit="s",
                thresholds=((60, "orange"), (300, "red")),
                description="The last batch's own duration, and quantiles over the batches of the "
                "last minute at least (buckets up to an hour).",
            ),
            Panel(
                "Model freshness: age of the newest data it learned",
                (
                    Query("streamtrain_model_freshness_seconds", "now"),
                    Query(_quantile(0.99, "streamtrain_model_freshness_sampled_seconds"), "p99"),
                ),
                unit="s",
                thresholds=((60, "orange"), (300, "red")),
                description="Now minus the newest Kafka timestamp whose update the center holds, "
                "the oldest partition's; p99 of its samples (about one a second). Red at "
                "StreamtrainModelStale's default threshold.",
            ),
            Panel(
                "Parameter-server updates per second",
                (Query(_rate("streamtrain_ps_updates_total"), "updates/s"),),
                unit="short",
            ),
        ),
    ),
    (
        "Is training healthy?",
        (
            Panel(
                "Loss (prequential: each batch scored before training on it)",
                (Query("streamtrain_train_prequential_loss", "loss"),),
                unit="short",
            ),
            Panel(
                "Accuracy",
                (
                    Query("streamtrain_train_prequential_accuracy", "prequential"),
                    Query("streamtrain_eval_heldout_accuracy", "held-out"),
                    # A drift as a mark at the top of the axis (1 = 100%), where its window saw one.
                    Query(
                        f"(sum by (signal) (increase(streamtrain_drift_detected_total{_RATE})) > "
                        "0) * 0 + 1",
                        "drift ({{signal}})",
                    ),
                ),
                unit="percentunit",
                description="Prequential and held-out accuracy; a mark at 100% where a drift was "
                "found (its signal named). After a drift the held-out score is on records held "
                "out since (docs/drift.md).",
            ),
            Panel(
                "Staleness of pushes (updates between pull and push)",
                (
                    Query(_quantile(0.5, "streamtrain_ps_staleness_updates"), "p50"),
                    Query(_quantile(0.99, "streamtrain_ps_staleness_updates"), "p99"),
                ),
                unit="short",
                thresholds=((16, "orange"), (32, "red")),
            ),
            Panel(
                "Parameter-server request latency",
                (
                    Query(
                        _quantile(0.5, "streamtrain_ps_request_duration_seconds", "op"),
                        "p50 {{op}}",
                    ),
                    Query(
                        _quantile(0.99, "streamtrain_ps_request_duration_seconds", "op"),
                        "p99 {{op}}",
                    ),
                ),
                unit="s",
                width=12,
                thresholds=((0.5, "orange"), (2, "red")),
            ),
            Panel(
                "Busy workers: compute vs exchange",
                (Query(_rate("streamtrain_worker_seconds_total", "activity"), "{{activity}}"),),
                unit="short",
                width=12,
                description="Worker-seconds per second in each activity, all workers: 2 is two "
                "workers busy all the time.",
            ),
        ),
    ),
    (
        "Serving",
        (
            Panel(
                "Prediction requests per second, by status",
                (Query(_rate("streamtrain_serve_requests_total", "code"), "{{code}}"),),
                unit="reqps",
                width=8,
            ),
            Panel(
                "Prediction latency",
                (
                    Query(_quantile(0.5, "streamtrain_serve_request_seconds"), "p50"),
                    Query(_quantile(0.99, "streamtrain_serve_request_seconds"), "p99"),
                ),
                unit="s",
                width=8,
                thresholds=((0.1, "orange"), (1, "red")),
            ),
            Panel(
                "Served weights: age",
                (Query("max(streamtrain_serve_weights_age_seconds)", "age"),),
                unit="s",
                width=8,
                thresholds=((5, "orange"), (60, "red")),
                description="Seconds since the served weights were the parameter server's center "
                "(or since the checkpoint served was written).",
            ),
            Panel(
                "Instances per request",
                (
                    Query(_quantile(0.5, "streamtrain_serve_instances"), "p50"),
                    Query(_quantile(0.99, "streamtrain_serve_instances"), "p99"),
                ),
                unit="short",
                width=8,
            ),
            Panel(
                "Refused requests per second, by reason",
                (Query(_rate("streamtrain_serve_bad_requests_total", "reason"), "{{reason}}"),),
                unit="reqps",
                width=8,
                thresholds=((1, "orange"),),
            ),
        ),
    ),
    (
        "What was rejected, and why?",
        (
            Panel(
                "Rejected records per second, by reason",
                (
                    Query(
                        _rate("streamtrain_stream_records_rejected_total", "reason"), "{{reason}}"
                    ),
                ),
                unit="short",
                width=12,
                thresholds=((1, "orange"),),
            ),
            Panel(
                "Producer problems per second",
                (
                    Query(
                        _rate("streamtrain_producer_send_errors_total", "topic"),
                        "send errors {{topic}}",
                    ),
                    Query(
                        _rate("streamtrain_producer_malformed_rows_total", "dataset, reason"),
                        "malformed rows {{dataset}} ({{reason}})",
                    ),
                ),
                unit="short",
                width=12,
            ),
        ),
    ),
    (
        PREDICT_ROW,
        (
            Panel(
                "Predictions written per second (predict stream)",
                (Query(_rate("streamtrain_predictions_written_total", "topic"), "{{topic}}"),),
                unit="short",
                width=12,
                description="Fed by `streamtrain predict`, a job of its own that the compose "
                "stack does not run.",
            ),
        ),
    ),
    (
        TABLES_ROW,
        (
            Panel(
                "Rows per table",
                (Query("sum by (table) (streamtrain_id_table_rows)", "{{table}}"),),
                width=8,
                description="Only a schema with ID features fills this row.",
            ),
            Panel(
                "Table memory",
                (Query("sum by (table) (streamtrain_id_table_bytes)", "{{table}}"),),
                unit="bytes",
                width=8,
                description="Bounded by each table's ttl and min_count.",
            ),
            Panel(
                "Rows created and expired per second",
                (
                    Query(_rate("streamtrain_id_rows_created_total", "table"), "created {{table}}"),
                    Query(_rate("streamtrain_id_rows_expired_total", "table"), "expired {{table}}"),
                ),
                width=8,
            ),
            Panel(
                "Rows read and pushed per second",
                (Query(_rate("streamtrain_id_rows_moved_total", "direction"), "{{direction}}"),),
                width=8,
            ),
            Panel(
                "Row push staleness",
                (
                    Query(_quantile(0.5, "streamtrain_id_row_staleness"), "p50"),
                    Query(_quantile(0.99, "streamtrain_id_row_staleness"), "p99"),
                ),
                width=8,
                no_value=_IDLE,
            ),
            Panel(
                "Unknown IDs served per second",
                (Query(_rate("streamtrain_serve_unknown_ids_total", "model"), "{{model}}"),),
                width=8,
                description="IDs in prediction requests without a row of their own yet: they "
                "read their table's shared row.",
            ),
        ),
    ),
)
