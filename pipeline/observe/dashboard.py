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

import json
import logging
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError, StreamtrainError
from pipeline.observe.panels import COLLAPSED, ROWS

log = logging.getLogger(__name__)

DATASOURCE_UID = "streamtrain-prometheus"
DASHBOARD_UID = "streamtrain-overview"
TITLE = "streamtrain: online training"
#: Where the committed dashboard lives in a checkout (Grafana provisions it from there).
DEFAULT_FILE = Path(__file__).resolve().parents[2] / "dashboards" / "streamtrain.json"

#: The least window of a panel's rates (Grafana's "Min interval"): several micro-batches.
STEADY_WINDOW = "1m"


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
    board = (
        gd.Dashboard(TITLE)
        .uid(DASHBOARD_UID)
        .tags(["streamtrain"])
        .refresh("5s")
        .time("now-30m", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .editable()
    )
    ids = iter(range(1, 1000))  # Grafana links and provisioning want stable, unique panel ids
    for row_title, specs in ROWS:
        row = gd.Row(row_title).id(next(ids))
        made = []
        for spec in specs:
            panel: Any
            if spec.kind == "stat":
                panel = gs.Panel().height(4)
            else:
                legend = (
                    gc.VizLegendOptions()
                    .show_legend(True)
                    .display_mode(LegendDisplayMode.LIST)
                    .placement(LegendPlacement.BOTTOM)
                )
                panel = gt.Panel().height(8).legend(legend).fill_opacity(10).line_width(1)
            panel = (
                panel.id(next(ids))
                .title(spec.title)
                .unit(spec.unit)
                .span(spec.width)
                .datasource(source)
            )
            if spec.description:
                panel = panel.description(spec.description)
            if any("rate(" in q.expr for q in spec.queries):
                panel = panel.interval(STEADY_WINDOW)
            if spec.no_value:
                panel = panel.no_value(spec.no_value)
            if spec.thresholds:
                steps = [Threshold(None, spec.base), *(Threshold(v, c) for v, c in spec.thresholds)]
                panel = panel.thresholds(
                    gd.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps)
                )
                if spec.kind != "stat":
                    panel = panel.thresholds_style(
                        gc.GraphThresholdsStyleConfig().mode(GraphTresholdsStyleMode.DASHED)
                    )
            for i, q in enumerate(spec.queries):
                panel = panel.with_target(
                    gp.Dataquery().expr(q.expr).legend_format(q.legend).ref_id(chr(65 + i))
                )
            made.append(panel)
        if row_title in COLLAPSED:  # its panels inside it: shown once someone opens the row
            for panel in made:
                row = row.with_panel(panel)
        board = board.with_row(row)
        if row_title not in COLLAPSED:
            for panel in made:
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
        raise ConfigError(
            f"The dashboard does not parse as a Grafana dashboard ({type(e).__name__}: {e})."
        ) from None
    if queries(again) != queries(dashboard):
        raise ConfigError(
            "The dashboard changed in a round trip through grafana-foundation-sdk's models."
        )


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

    >>> queries(
    ...     {
    ...         "panels": [
    ...             {"type": "stat", "title": "T", "targets": [{"expr": "up", "legendFormat": "u"}]}
    ...         ]
    ...     }
    ... )
    [('T', 'up', 'u')]
    """
    return [
        (p.get("title", ""), t.get("expr", ""), t.get("legendFormat", ""))
        for p in panels(dashboard)
        for t in p.get("targets", [])
    ]


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


def query_range(
    prometheus: str, expr: str, start: float, end: float, step: float
) -> list[dict[str, Any]]:
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
        raise StreamtrainError(
            f"Cannot reach Prometheus at {prometheus} ({e}). Pass its URL with --prometheus."
        ) from None
    if body.get("status") != "success":
        raise StreamtrainError(f"Prometheus failed the query {expr!r}: {body.get('error')}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


# --- Grafana ------------------------------------------------------------------------------


def datasource(prometheus_url: str) -> dict[str, Any]:
    """The Prometheus datasource the dashboard expects (fixed uid)."""
    return {
        "uid": DATASOURCE_UID,
        "name": "streamtrain Prometheus",
        "type": "prometheus",
        "access": "proxy",
        "url": prometheus_url,
        "isDefault": False,
        "jsonData": {"timeInterval": "5s"},
    }


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


def push(
    grafana_url: str,
    prometheus_url: str,
    *,
    token: str | None = None,
    dashboard: dict[str, Any] | None = None,
    folder: str = "streamtrain",
) -> str:
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
        answer = api.dashboard.update_dashboard(
            {
                "dashboard": {**board, "id": None},
                "folderUid": folder,
                "overwrite": True,
                "message": "streamtrain dashboards push",
            }
        )
    except GrafanaException as e:
        raise StreamtrainError(f"Grafana at {where} refused the upload: {e}") from None
    except Exception as e:  # connection errors come from niquests/urllib3 in several types
        raise StreamtrainError(
            f"Cannot upload to Grafana at {where} ({type(e).__name__}: {e})."
        ) from None
    base = where.rstrip("/")
    return f"{base}{answer.get('url', '/d/' + DASHBOARD_UID)}"
