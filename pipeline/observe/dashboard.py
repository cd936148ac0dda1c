"""The Grafana dashboard: its panels declared once, built with grafana-foundation-sdk,
pushed with grafana-client, and read back for rendering and for tests.

``dashboards/streamtrain.json`` is :func:`build`'s output, committed for Grafana's
file provisioning; a test keeps it equal to what this module builds. Rebuild it with
``streamtrain dashboards build``.

Every query is written for Prometheus with Grafana's ``$__rate_interval``; anything
that evaluates a query outside Grafana first calls :func:`expand` with the window of
:func:`rate_window`. Every panel that takes a rate has a minimum interval of a minute
(:data:`STEADY_WINDOW`), so its window spans several micro-batches: a counter that steps
by 20,000 every 9 s reads as a steady 2,128/s, not 1,333 and 2,667 in turn.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError, StreamtrainError

log = logging.getLogger(__name__)

DATASOURCE_UID = "streamtrain-prometheus"
DASHBOARD_UID = "streamtrain-overview"
TITLE = "streamtrain: online training"
#: Where the committed dashboard lives in a checkout (Grafana provisions it from there).
DEFAULT_FILE = Path(__file__).resolve().parents[2] / "dashboards" / "streamtrain.json"

_RATE = "[$__rate_interval]"
#: The least window of a panel's rates (Grafana's "Min interval"): several micro-batches.
STEADY_WINDOW = "1m"


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


ROWS: tuple[tuple[str, tuple[Panel, ...]], ...] = (
    ("At a glance", (
        Panel("Trained records/s", (Query(_rate("streamtrain_train_records_total"), "trained/s"),),
              kind="stat", width=4, base="red", thresholds=((1, "green"),),
              description="Over the last minute at least (several micro-batches); red: nothing trained."),
        Panel("Consumer lag", (Query("sum(streamtrain_stream_consumer_lag_records)", "records"),),
              kind="stat", width=4, thresholds=((10_000, "orange"), (100_000, "red")),
              description="Records in Kafka not yet trained, all partitions (StreamtrainLagGrowing from "
                          "10,000 and rising)."),
        Panel("Held-out accuracy", (Query("max(streamtrain_eval_heldout_accuracy)", "accuracy"),),
              unit="percentunit", kind="stat", width=4, base="red", thresholds=((0.5, "orange"), (0.8, "green")),
              no_value="not scored yet"),
        Panel("Staleness p99", (Query(_quantile(0.99, "streamtrain_ps_staleness_updates"), "updates"),),
              kind="stat", width=4, thresholds=((16, "orange"), (32, "red")), no_value=_IDLE,
              description="Red from 32, where StreamtrainStalenessHigh fires."),
        Panel("Since last batch", (Query("time() - max(streamtrain_train_last_batch_timestamp_seconds) >= 0",
                                         "age"),),
              unit="s", kind="stat", width=4, thresholds=((60, "orange"), (120, "red")), no_value="no batch yet",
              description="Seconds since a micro-batch was last trained (a resumed run: since its checkpoint "
                          "was written)."),
        Panel("Rejected records", (Query("sum(streamtrain_stream_records_rejected_total)", "rejected"),),
              kind="stat", width=4, thresholds=((1, "orange"),),
              description="Set aside to the dead-letter topic since this trainer started."),
    )),
    ("Is data flowing?", (
        Panel("Records per second: produced, ingested, trained", (
            Query(_rate("streamtrain_producer_records_sent_total", "topic"), "produced {{topic}}"),
            Query(_rate("streamtrain_stream_records_ingested_total", "topic"), "ingested {{topic}}"),
            Query(_rate("streamtrain_train_records_total", "topic"), "trained {{topic}}"),
        ), unit="short", width=12),
        Panel("Consumer lag per partition", (
            Query("streamtrain_stream_consumer_lag_records", "{{topic}}-{{partition}}"),
        ), unit="short", width=12, description="Log end offset minus the end of the last trained batch."),
        Panel("Micro-batch duration", (
            Query("streamtrain_stream_last_batch_duration_seconds", "last batch"),
            Query(_quantile(0.5, "streamtrain_stream_batch_duration_seconds"), "p50"),
            Query(_quantile(0.99, "streamtrain_stream_batch_duration_seconds"), "p99"),
        ), unit="s", thresholds=((60, "orange"), (300, "red")),
              description="The last batch's own duration, and quantiles over the batches of the last minute at "
                          "least (buckets up to an hour)."),
        Panel("Freshness: now minus event time when trained", (
            Query("streamtrain_train_freshness_seconds", "median of the last batch"),
        ), unit="s", thresholds=((60, "orange"), (300, "red"))),
        Panel("Parameter-server updates per second", (
            Query(_rate("streamtrain_ps_updates_total"), "updates/s"),
        ), unit="short"),
    )),
    ("Is training healthy?", (
        Panel("Loss (prequential: each batch scored before training on it)", (
            Query("streamtrain_train_prequential_loss", "loss"),
        ), unit="short"),
        Panel("Accuracy", (
            Query("streamtrain_train_prequential_accuracy", "prequential"),
            Query("streamtrain_eval_heldout_accuracy", "held-out"),
        ), unit="percentunit"),
        Panel("Staleness of pushes (updates between pull and push)", (
            Query(_quantile(0.5, "streamtrain_ps_staleness_updates"), "p50"),
            Query(_quantile(0.99, "streamtrain_ps_staleness_updates"), "p99"),
        ), unit="short", thresholds=((16, "orange"), (32, "red"))),
        Panel("Parameter-server request latency", (
            Query(_quantile(0.5, "streamtrain_ps_request_duration_seconds", "op"), "p50 {{op}}"),
            Query(_quantile(0.99, "streamtrain_ps_request_duration_seconds", "op"), "p99 {{op}}"),
        ), unit="s", width=12, thresholds=((0.5, "orange"), (2, "red"))),
        Panel("Busy workers: compute vs exchange", (
            Query(_rate("streamtrain_worker_seconds_total", "activity"), "{{activity}}"),
        ), unit="short", width=12,
              description="Worker-seconds per second in each activity, all workers: 2 is two workers busy all "
                          "the time."),
    )),
    ("Serving", (
        Panel("Prediction requests per second, by status", (
            Query(_rate("streamtrain_serve_requests_total", "code"), "{{code}}"),
        ), unit="reqps", width=8),
        Panel("Prediction latency", (
            Query(_quantile(0.5, "streamtrain_serve_request_seconds"), "p50"),
            Query(_quantile(0.99, "streamtrain_serve_request_seconds"), "p99"),
        ), unit="s", width=8, thresholds=((0.1, "orange"), (1, "red"))),
        Panel("Served weights: age", (
            Query("max(streamtrain_serve_weights_age_seconds)", "age"),
        ), unit="s", width=8, thresholds=((5, "orange"), (60, "red")), description="Seconds since the served weights were the parameter server's center "
                                          "(or since the checkpoint served was written)."),
        Panel("Instances per request", (
            Query(_quantile(0.5, "streamtrain_serve_instances"), "p50"),
            Query(_quantile(0.99, "streamtrain_serve_instances"), "p99"),
        ), unit="short", width=8),
        Panel("Refused requests per second, by reason", (
            Query(_rate("streamtrain_serve_bad_requests_total", "reason"), "{{reason}}"),
        ), unit="reqps", width=8, thresholds=((1, "orange"),)),
        Panel("Predictions written per second (predict stream)", (
            Query(_rate("streamtrain_predictions_written_total", "topic"), "{{topic}}"),
        ), unit="short", width=8),
    )),
    ("What was rejected, and why?", (
        Panel("Rejected records per second, by reason", (
            Query(_rate("streamtrain_stream_records_rejected_total", "reason"), "{{reason}}"),
        ), unit="short", width=12, thresholds=((1, "orange"),)),
        Panel("Producer problems per second", (
            Query(_rate("streamtrain_producer_send_errors_total", "topic"), "send errors {{topic}}"),
            Query(_rate("streamtrain_producer_malformed_rows_total", "dataset, reason"),
                  "malformed rows {{dataset}} ({{reason}})"),
        ), unit="short", width=12),
    )),
)


def build() -> dict[str, Any]:
    """The dashboard as Grafana JSON, built with grafana-foundation-sdk."""
    from grafana_foundation_sdk.builders import common as gc
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.builders import prometheus as gp
    from grafana_foundation_sdk.builders import stat as gs
    from grafana_foundation_sdk.builders import timeseries as gt
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.common import (
        GraphTresholdsStyleMode,
        LegendDisplayMode,
        LegendPlacement,
    )
    from grafana_foundation_sdk.models.dashboard import (
        DashboardCursorSync,
        DataSourceRef,
        Threshold,
        ThresholdsMode,
    )

    source = DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
    board = (gd.Dashboard(TITLE).uid(DASHBOARD_UID).tags(["streamtrain"]).refresh("5s").time("now-30m", "now")
             .timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR).editable())
    ids = iter(range(1, 1000))  # Grafana links and provisioning want stable, unique panel ids
    for row_title, panels in ROWS:
        board = board.with_row(gd.Row(row_title).id(next(ids)))
        for spec in panels:
            panel: Any
            if spec.kind == "stat":
                panel = gs.Panel().height(4)
            else:
                legend = gc.VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST) \
                    .placement(LegendPlacement.BOTTOM)
                panel = gt.Panel().height(8).legend(legend).fill_opacity(10).line_width(1)
            panel = panel.id(next(ids)).title(spec.title).unit(spec.unit).span(spec.width).datasource(source)
            if spec.description:
                panel = panel.description(spec.description)
            if any("rate(" in q.expr for q in spec.queries):
                panel = panel.interval(STEADY_WINDOW)
            if spec.no_value:
                panel = panel.no_value(spec.no_value)
            if spec.thresholds:
                steps = [Threshold(None, spec.base), *(Threshold(v, c) for v, c in spec.thresholds)]
                panel = panel.thresholds(gd.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps))
                if spec.kind != "stat":
                    panel = panel.thresholds_style(gc.GraphThresholdsStyleConfig().mode(GraphTresholdsStyleMode.DASHED))
            for i, q in enumerate(spec.queries):
                panel = panel.with_target(gp.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(65 + i)))
            board = board.with_panel(panel)
    built: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return built


def validate(dashboard: dict[str, Any]) -> None:
    """Parse ``dashboard`` with grafana-foundation-sdk's models; raise ConfigError if it
    does not describe the same panels and queries after the round trip."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    try:
        again = json.loads(json.dumps(Dashboard.from_json(dashboard), cls=JSONEncoder))
    except Exception as e:
        raise ConfigError(f"The dashboard does not parse as a Grafana dashboard ({type(e).__name__}: {e}).") from None
    if queries(again) != queries(dashboard):
        raise ConfigError("The dashboard changed in a round trip through grafana-foundation-sdk's models.")


def load(path: str | Path | None = None) -> dict[str, Any]:
    """A dashboard from a JSON file; with no path, the one this module builds."""
    if path is None:
        return build()
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"Expected a Grafana dashboard JSON file at {p}; there is none.")
    try:
        loaded: dict[str, Any] = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ConfigError(f"{p} is not JSON ({e}).") from None
    return loaded


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's panels that query data, in order (collapsed rows included)."""
    out = []
    for p in dashboard.get("panels", []):
        if p.get("type") == "row":
            out += [q for q in p.get("panels", []) if q.get("targets")]
        elif p.get("targets"):
            out.append(p)
    return out


def queries(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(panel title, expr, legend)`` of every query.

    >>> queries({"panels": [{"type": "stat", "title": "T", "targets": [{"expr": "up", "legendFormat": "u"}]}]})
    [('T', 'up', 'u')]
    """
    return [(p.get("title", ""), t.get("expr", ""), t.get("legendFormat", ""))
            for p in panels(dashboard) for t in p.get("targets", [])]


def rate_window(panel: dict[str, Any], scrape_s: float, step_s: float = 0.0) -> float:
    """``$__rate_interval`` as Grafana computes it for ``panel``: its interval (the step, at
    least the panel's minimum interval, in s, m or h) plus a scrape, at least four scrapes.

    >>> rate_window({"interval": "1m"}, 5), rate_window({}, 5), rate_window({}, 1, 30)
    (65.0, 20.0, 31.0)
    """
    least = re.fullmatch(r"([0-9.]+)([smh])", panel.get("interval") or "0s")
    floor = float(least.group(1)) * {"s": 1, "m": 60, "h": 3600}[least.group(2)] if least else 0.0
    return float(max(max(step_s, floor) + scrape_s, 4 * scrape_s))


def expand(expr: str, rate_interval_s: float) -> str:
    """Replace Grafana's interval variables with a concrete window.

    >>> expand("rate(x[$__rate_interval])", 20)
    'rate(x[20s])'
    """
    window = f"{max(1, round(rate_interval_s))}s"
    return re.sub(r"\$__(rate_interval|interval)\b|\$\{__(rate_interval|interval)\}", window, expr)


def legend(template: str, labels: dict[str, str]) -> str:
    """Fill a Grafana legend template from a series' labels.

    >>> legend("p99 {{op}}", {"op": "pull"})
    'p99 pull'
    """
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template).strip()


# --- Prometheus ---------------------------------------------------------------------------


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
    """Evaluate ``expr`` over ``[start, end]`` with Prometheus's HTTP API; return its series
    (``{"metric": labels, "values": [[t, "v"], ...]}``)."""
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    url = f"{prometheus.rstrip('/')}/api/v1/query_range?{params}"
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as e:
        detail = e.read().decode(errors="replace")[:300]
        raise StreamtrainError(f"Prometheus refused the query {expr!r}: {detail}") from None
    except (urllib.error.URLError, OSError) as e:
        raise StreamtrainError(f"Cannot reach Prometheus at {prometheus} ({e}). Pass its URL with --prometheus.") from None
    if body.get("status") != "success":
        raise StreamtrainError(f"Prometheus failed the query {expr!r}: {body.get('error')}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


# --- Grafana ------------------------------------------------------------------------------


def datasource(prometheus_url: str) -> dict[str, Any]:
    """The Prometheus datasource the dashboard expects (fixed uid)."""
    return {"uid": DATASOURCE_UID, "name": "streamtrain Prometheus", "type": "prometheus", "access": "proxy",
            "url": prometheus_url, "isDefault": False, "jsonData": {"timeInterval": "5s"}}


def redact(url: str) -> str:
    """A URL fit for logs: no password.

    >>> redact("http://admin:secret@grafana:3000/")
    'http://admin:***@grafana:3000/'
    """
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def push(grafana_url: str, prometheus_url: str, *, token: str | None = None, dashboard: dict[str, Any] | None = None,
         folder: str = "streamtrain") -> str:
    """Create or update the datasource, a folder and the dashboard in Grafana; return the
    dashboard's URL. Credentials: ``token`` (a service-account token), else the URL's
    ``user:password@``."""
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaClientError, GrafanaException

    board = dashboard or build()
    api = GrafanaApi.from_url(grafana_url, credential=token)
    where = redact(grafana_url)
    try:
        source = datasource(prometheus_url)
        try:
            api.datasource.get_datasource_by_uid(DATASOURCE_UID)
        except GrafanaClientError as e:
            if getattr(e, "status_code", None) != 404:
                raise
            api.datasource.create_datasource(source)
        else:
            api.datasource.update_datasource_by_uid(DATASOURCE_UID, source)
        try:
            api.folder.get_folder(folder)
        except GrafanaClientError as e:
            if getattr(e, "status_code", None) != 404:
                raise
            api.folder.create_folder(folder, uid=folder)
        answer = api.dashboard.update_dashboard({"dashboard": {**board, "id": None}, "folderUid": folder,
                                                 "overwrite": True, "message": "streamtrain dashboards push"})
    except GrafanaException as e:
        raise StreamtrainError(f"Grafana at {where} refused the upload: {e}") from None
    except Exception as e:  # connection errors come from niquests/urllib3 in several types
        raise StreamtrainError(f"Cannot upload to Grafana at {where} ({type(e).__name__}: {e}).") from None
    base = where.rstrip("/")
    return f"{base}{answer.get('url', '/d/' + DASHBOARD_UID)}"
