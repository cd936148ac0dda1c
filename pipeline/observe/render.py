"""The dashboard drawn from Prometheus data with matplotlib, for people without Grafana."""

from __future__ import annotations

import datetime as dt
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.observe import dashboard as dash
from pipeline.observe.report_plot import pyplot

# Grafana grid units: 24 columns; a height unit is 30 px there, about 0.42 inch here.
_UNIT_W, _UNIT_H = 0.9, 0.5


def fmt(value: float, unit: str) -> str:
    """A value as a stat panel shows it.

    >>> fmt(0.98734, "percentunit"), fmt(1234567, "short"), fmt(0.0021, "s"), fmt(float("nan"), "s")
    ('98.73%', '1.23M', '2.1 ms', 'no data')
    """
    if not math.isfinite(value):
        return "no data"
    if unit == "percentunit":
        return f"{value * 100:.2f}%"
    if unit == "s":
        if abs(value) < 1:
            return f"{value * 1000:.1f} ms"
        return f"{value:.1f} s" if abs(value) < 120 else f"{value / 60:.1f} min"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:.3g}{suffix}"
    return f"{value:.3g}"


def parse_duration(text: str) -> float:
    """Seconds in ``30m``, ``2h``, ``90s`` or ``1d``.

    >>> parse_duration("30m"), parse_duration("90s"), parse_duration("2h")
    (1800.0, 90.0, 7200.0)
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        return float(text[:-1]) * units[text[-1]]
    except (KeyError, ValueError, IndexError):
        raise ConfigError(
            f"Expected a duration such as 90s, 30m, 2h or 1d. Received: {text!r}"
        ) from None


def render(
    dashboard: dict[str, Any],
    prometheus: str,
    out: str | Path,
    *,
    since_s: float = 1800.0,
    end: float | None = None,
    points: int = 240,
    scrape_s: float = 5.0,
) -> dict[str, int]:
    """Draw every panel of ``dashboard`` from ``prometheus`` over the last ``since_s``
    seconds into one PNG laid out as Grafana lays it out (a collapsed row closed, as Grafana
    opens the dashboard); return the series found per panel title (0: the panel shows "no
    data")."""
    plt = pyplot()
    from matplotlib import dates as mdates

    end = time.time() if end is None else end
    start = end - since_s
    step = max(1.0, since_s / points)
    items = dashboard.get("panels", [])
    if not items:
        raise ConfigError("The dashboard has no panels to render.")
    units_high = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in items)
    top_in = 0.6  # the figure's title
    fig_w, fig_h = 24 * _UNIT_W, units_high * _UNIT_H + top_in
    fig = plt.figure(figsize=(fig_w, fig_h))
    stamp = (
        f"{dt.datetime.fromtimestamp(start):%Y-%m-%d %H:%M:%S} to "
        f"{dt.datetime.fromtimestamp(end):%H:%M:%S}"
    )
    fig.text(
        0.01,
        1 - 0.35 / fig_h,
        f"{dashboard.get('title', 'dashboard')}    {stamp}    ({prometheus})",
        fontsize=15,
        fontweight="bold",
        va="center",
    )

    def box(g: dict[str, int], left: float, right: float, top: float, bottom: float) -> list[float]:
        """A grid position, inset by margins in inches, as a figure-fraction rectangle."""
        x0, x1 = g["x"] * _UNIT_W + left, (g["x"] + g["w"]) * _UNIT_W - right
        y_top = fig_h - top_in - g["y"] * _UNIT_H - top
        y_bottom = fig_h - top_in - (g["y"] + g["h"]) * _UNIT_H + bottom
        return [x0 / fig_w, y_bottom / fig_h, (x1 - x0) / fig_w, (y_top - y_bottom) / fig_h]

    found: dict[str, int] = {}
    lo, hi = dt.datetime.fromtimestamp(start), dt.datetime.fromtimestamp(end)
    for p in items:
        g, title = p["gridPos"], p.get("title", "")
        if p.get("type") == "row":
            left, bottom, _, height = box(
                g, 0.1, 0, 0.28, 0
            )  # the title's baseline, 0.28 in below the row's top
            if p.get("collapsed"):  # as Grafana shows it: closed, its panels inside
                title += f"  (collapsed: {len(p.get('panels', []))} panels)"
            fig.text(
                left,
                bottom + height,
                title,
                fontsize=13,
                fontweight="bold",
                color="#333333",
                va="center",
            )
            continue
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        series = []
        for t in p.get("targets", []):
            window = dash.rate_window(p, scrape_s, step)
            for s in dash.query_range(prometheus, dash.expand(t["expr"], window), start, end, step):
                values = np.array(s["values"], dtype=float).reshape(-1, 2)
                series.append((dash.legend(t.get("legendFormat", ""), s["metric"]), values))
        found[title] = len(series)
        frame = fig.add_axes(box(g, 0.08, 0.08, 0.05, 0.05))  # the panel's card, as in Grafana
        frame.set_xticks([])
        frame.set_yticks([])
        frame.set_facecolor("#f7f7f7")
        for side in frame.spines.values():
            side.set_color("#cccccc")
        frame.text(
            0.01, 0.97, title, transform=frame.transAxes, fontsize=10, fontweight="bold", va="top"
        )
        if p.get("type") == "stat":
            # Grafana's default reduction: the last value that is not null.
            last = [v[np.isfinite(v[:, 1]), 1] for _, v in series]
            shown = next((float(x[-1]) for x in last if len(x)), float("nan"))
            frame.text(
                0.5,
                0.42,
                fmt(shown, unit),
                fontsize=24,
                ha="center",
                va="center",
                transform=frame.transAxes,
                color="#1f6f3f" if math.isfinite(shown) else "#888888",
            )
            continue
        if not series:
            frame.text(
                0.5,
                0.5,
                "no data",
                ha="center",
                va="center",
                transform=frame.transAxes,
                color="#888888",
            )
            continue
        legend_in = 0.22 * math.ceil(len(series) / 3) if any(label for label, _ in series) else 0
        ax = fig.add_axes(box(g, 0.75, 0.2, 0.35, 0.4 + legend_in))
        for label, values in series:
            times = [dt.datetime.fromtimestamp(x) for x in values[:, 0]]
            ax.plot(times, values[:, 1], label=label or None, linewidth=1.3)
        ax.set_xlim(lo, hi)
        ax.xaxis.set_major_locator(mdates.AutoDateLocator(maxticks=6))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        ax.yaxis.set_major_formatter(lambda v, _, unit=unit: fmt(v, unit))
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        ax.set_facecolor("white")
        if legend_in:
            ax.legend(
                fontsize=8, loc="upper left", bbox_to_anchor=(0, -0.12), ncols=3, frameon=False
            )
    fig.savefig(out, dpi=80, facecolor="white")
    plt.close(fig)
    return found
