"""`streamtrain dashboards`: the Grafana dashboard built, pushed, or rendered without Grafana."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pipeline import config
from pipeline.cli.base import cli
from pipeline.observe.dashboard import DEFAULT_FILE as DASHBOARD_FILE


@cli.group()
def dashboards() -> None:
    """The Grafana dashboard: build its JSON, push it to Grafana, or render it without Grafana."""


@dashboards.command("build")
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=str(DASHBOARD_FILE),
    show_default=True,
    help="Where to write the dashboard JSON.",
)
def dashboards_build(out: str) -> None:
    """Write the dashboard as Grafana JSON (what deploy/grafana provisions)."""
    from pipeline.observe import dashboard

    board = dashboard.build()
    dashboard.validate(board)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(board, indent=2, sort_keys=True) + "\n")
    click.echo(f"{len(dashboard.panels(board))} panels written to {out}")


@dashboards.command("push")
@click.option(
    "--grafana-url",
    required=True,
    help="Grafana's URL, e.g. http://admin:admin@localhost:3000 (or a token in GRAFANA_TOKEN).",
)
@click.option(
    "--prometheus-url",
    default="http://prometheus:9090",
    show_default=True,
    help="Prometheus as Grafana reaches it (the datasource's URL).",
)
@click.option(
    "--dashboard",
    "dashboard_path",
    type=click.Path(dir_okay=False),
    help="A dashboard JSON file (default: the built-in dashboard).",
)
@click.option(
    "--folder", default="streamtrain", show_default=True, help="Grafana folder uid and title."
)
def dashboards_push(
    grafana_url: str, prometheus_url: str, dashboard_path: str | None, folder: str
) -> None:
    """Upload the Prometheus datasource and the dashboard to Grafana with grafana-client."""
    from pipeline.observe import dashboard

    board = dashboard.load(dashboard_path)
    url = dashboard.push(
        grafana_url, prometheus_url, token=_grafana_token(), dashboard=board, folder=folder
    )
    click.echo(f"datasource {dashboard.DATASOURCE_UID} and dashboard uploaded: {url}")


def _grafana_token() -> str | None:
    token = config.settings().grafana_token
    return token.get_secret_value() if token else None


@dashboards.command("render")
@click.option(
    "--prometheus",
    "prometheus_url",
    default="http://127.0.0.1:9090",
    show_default=True,
    help="Prometheus that scraped the run.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default="panels.png",
    show_default=True,
    help="The PNG to write.",
)
@click.option(
    "--since", default="30m", show_default=True, help="How far back to draw: 90s, 30m, 2h, 1d."
)
@click.option(
    "--dashboard",
    "dashboard_path",
    type=click.Path(dir_okay=False),
    help="A dashboard JSON file (default: the built-in dashboard).",
)
@click.option(
    "--scrape-interval",
    default="5s",
    show_default=True,
    help="Prometheus's scrape interval (sets the rate window as Grafana would).",
)
def dashboards_render(
    prometheus_url: str, out: str, since: str, dashboard_path: str | None, scrape_interval: str
) -> None:
    """Draw the dashboard's panels from Prometheus data into a PNG, for people without Grafana."""
    from pipeline.observe import dashboard, render

    found = render.render(
        dashboard.load(dashboard_path),
        prometheus_url,
        out,
        since_s=render.parse_duration(since),
        scrape_s=render.parse_duration(scrape_interval),
    )
    empty = [title for title, n in found.items() if not n]
    click.echo(
        f"{len(found)} panels drawn to {out}"
        + (f"; no data for: {', '.join(empty)}" if empty else "")
    )
