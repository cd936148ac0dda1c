"""A run's report picture: accuracy, throughput, staleness and lag over the run's time, every
session of it.
matplotlib with the Agg backend (no display needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.observe.timeline import Timeline, duration_label, timeline

#: Batches the accuracy axis leaves out of its range (a tenth of them, 3 at least): a
#: model's first scores are near chance.
_WARMUP_BATCHES = 3


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def count_label(value: float, _pos: object = None) -> str:
    """A count as a tick label, its scale in the label instead of an offset above the axis.

    >>> [count_label(v) for v in (0, 950, 20_000, 250_000, 1_070_000, 2.5e9)]
    ['0', '950', '20k', '250k', '1.07M', '2.5G']
    """
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:.3g}{suffix}"
    return f"{value:.3g}"


def accuracy_limits(prequential: Sequence[float], heldout: Sequence[float]) -> tuple[float, float]:
    """The accuracy axis's range: the scores after the first batches, with a margin, so that
    0.97 and 0.99 are apart rather than pressed against the top of a 0-1 axis.

    From a bit below the lowest held-out score and the lowest prequential score after the
    first few batches (near chance, they would stretch the axis again), to a bit above
    the highest (1 at most); a tenth of the range each side, 0.005 at least.

    >>> accuracy_limits([0.2, 0.5, 0.9, 0.97, 0.98, 0.99], [0.975, 0.985])
    (0.965, 0.995)
    >>> accuracy_limits([], [])
    (0.0, 1.0)
    """
    warmup = max(_WARMUP_BATCHES, len(prequential) // 10)
    settled = [*prequential[warmup:], *heldout] or [*prequential]
    settled = [v for v in settled if math.isfinite(v)]
    if not settled:
        return 0.0, 1.0
    low, high = min(settled), max(settled)
    pad = max(0.1 * (high - low), 0.005)
    return max(0.0, math.floor((low - pad) * 200) / 200), min(
        1.0, math.ceil((high + pad) * 200) / 200
    )


def report_plots(
    history: list[dict[str, Any]],
    out: str | Path,
    *,
    title: str = "",
    final: float | None = None,
    eval_every: int | None = None,
    eval_records: int | None = None,
    eval_share: float | None = None,
) -> dict[str, Any]:
    """Accuracy, throughput, staleness and lag of a run, against time since its first batch.

    ``history`` is every session's rows (``batches.jsonl``), placed on one clock
    (:func:`~pipeline.observe.timeline.timeline`): each resumed session is marked where it
    began, and no line crosses the time between sessions or an idle gap (shaded), where
    nothing was measured. Held-out accuracy is drawn wherever it was measured: the scored
    batches, and ``final`` (the score after the last batch) at the end, so that a run
    shorter than ``eval_every`` batches still shows one; the panel says what was measured
    how often. Returns the number of points drawn per series, and ``sessions``, ``idle``,
    ``span_s`` and the throughput's and lag's ``lines`` as drawn (what a test can check).
    """
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(2, 2, figsize=(13, 8), layout="constrained")
    fig.suptitle(title or "streamtrain run", fontsize=13)
    tl = timeline(history)
    t = tl.x
    (acc, thr), (stal, lag) = axes

    pre = [b.get("prequential_accuracy") for b in history]
    held: list[float | None] = [
        b["heldout"]["accuracy"] if "accuracy" in b.get("heldout", {}) else None for b in history
    ]
    if final is not None and len(t) and held[-1] is None:
        held[-1] = final  # the score after the last batch, at its end
    if any(v is not None for v in pre):
        acc.plot(
            *tl.gapped(pre),
            label="prequential (batch scored before training)",
            linewidth=1,
            alpha=0.7,
        )
    scored = [(float(x), v) for x, v in zip(t, held, strict=True) if v is not None]
    if (
        final is not None and len(t) and held[-1] != final
    ):  # the last batch was scored, and the final differs
        scored.append((float(t[-1]), final))
    if scored:
        # A line joins the held-out scores of one stretch; a stop or an idle gap breaks it.
        xs, ys = tl.gapped(held)
        keep = ~np.isnan(ys) | np.isnan(xs)
        acc.plot(xs[keep], ys[keep], "-", color="tab:orange", linewidth=1.5)
        acc.plot(
            *zip(*scored, strict=True), "o", color="tab:orange", label="held-out", markersize=4
        )
    measured = ["prequential: every training step's batch, before it trains"]
    # Each drift where the batch that showed it ended: the scores after it are on the new concept.
    drifts = [
        (float(x), d["signal"])
        for x, b in zip(t, history, strict=True)
        for d in b.get("drifts", ())
    ]
    for i, (x, _) in enumerate(drifts):
        acc.axvline(
            x, color="tab:red", linestyle=":", linewidth=1.4, label="drift" if i == 0 else None
        )
    if drifts:
        measured.append(
            "dotted red: a drift found ("
            + ", ".join(sorted({s for _, s in drifts}))
            + "); held-out "
            "after it: records held out of training since"
        )
    if eval_every is not None:
        split = f" on {eval_records:,} records" if eval_records else ""
        cap = f" (at most {eval_share:.0%} of the time)" if eval_share is not None else ""
        measured.append(f"held-out: every {eval_every} batches{cap} and at the end{split}")
    acc.set_title("Accuracy", loc="left")
    low, high = accuracy_limits([v for v in pre if v is not None], [v for _, v in scored])
    acc.set_ylim(low, high)
    if low > 0 and any(v is not None and v < low for v in pre):
        measured.append(f"axis from {low:g}: the first batches' lower scores run off the bottom")

    # Records per second over each batch's span: from the end of the one before, or from its
    # own start after a break (an idle gap or a stop is not slow training).
    trained = np.array([b["trained"] for b in history], dtype=float)
    spans = t - tl.start
    per_batch = np.divide(trained, spans, out=np.zeros_like(trained), where=spans > 0)
    lines = {
        "per batch": tl.gapped(per_batch.tolist()),
        "lag": tl.gapped([b["lag"] for b in history]),
    }
    thr.plot(*lines["per batch"], linewidth=0.8, alpha=0.5, label="per batch")
    if (
        len(t) >= 5
    ):  # five batches' records over their span, inside one stretch: steadier than one batch
        first = np.maximum.accumulate(
            np.where(tl.breaks | (np.arange(len(t)) == 0), np.arange(len(t)), 0)
        )
        window = []
        for i in range(len(t)):
            j = max(first[i], i - 4)
            window.append(trained[j : i + 1].sum() / max(1e-9, t[i] - tl.start[j]))
        thr.plot(*tl.gapped(window), linewidth=1.6, label="over 5 batches")
    thr.set_title("Throughput (records trained per second)", loc="left")
    thr.set_ylim(0, max(1.0, float(per_batch.max(initial=0))) * 1.15)

    p50 = [b.get("staleness_p50") for b in history]
    p99 = [b.get("staleness_p99") for b in history]
    if any(v is not None for v in p50):
        stal.plot(*tl.gapped(p50), label="p50", linewidth=1.2)
        stal.plot(*tl.gapped(p99), label="p99", linewidth=1.2)
    stal.set_title("Staleness (updates between a worker's pull and push)", loc="left")
    stal.set_ylim(0, max([1.0, *(v for v in p99 if v is not None)]) * 1.15)

    lag.plot(*lines["lag"], linewidth=1.2, color="tab:red")
    lag.set_title("Consumer lag (records in Kafka not yet trained)", loc="left")
    lag.set_ylim(bottom=0)

    for ax in (thr, lag):  # 1.07M on the tick itself, not "1e6" above the axis
        ax.yaxis.set_major_formatter(FuncFormatter(count_label))
    for ax in axes.flat:
        _mark(ax, tl)
        ax.xaxis.set_major_formatter(FuncFormatter(duration_label))
        ax.set_xlabel("time since the run's first batch")
        ax.grid(alpha=0.3)
        if (
            ax.get_legend_handles_labels()[0] and ax is acc
        ):  # above the plot, right of its title: off the data
            ax.legend(
                fontsize=8,
                loc="lower right",
                bbox_to_anchor=(1.0, 1.0),
                ncol=2,
                frameon=False,
                borderaxespad=0.2,
            )
        elif ax.get_legend_handles_labels()[0]:  # the axis has a margin above the data for it
            ax.legend(fontsize=8, loc="upper right", ncol=2)
        if not len(t):
            ax.text(
                0.5,
                0.5,
                "no data",
                ha="center",
                va="center",
                transform=ax.transAxes,
                color="#888888",
            )
    if tl.sessions or tl.idle:
        measured.append(
            f"{len(tl.sessions) + 1} sessions (dashed: a resumed trainer's first batch); "
            "shaded: the stream idle; no line crosses a stop or an idle gap"
        )
    acc.set_xlabel(
        "time since the run's first batch\n" + "\n".join(measured), fontsize=8, color="#555555"
    )
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return {
        "prequential": sum(v is not None for v in pre),
        "held-out": len(scored),
        "throughput": len(t),
        "drifts": len(drifts),
        "staleness": sum(v is not None for v in p50),
        "lag": len(t),
        "sessions": len(tl.sessions) + bool(len(t)),
        "idle": tl.idle,
        "span_s": float(t[-1]) if len(t) else 0.0,
        "lines": lines,
    }


def _mark(ax: Any, tl: Timeline) -> None:
    """A resumed session's start (a dashed line) and the stream's idle gaps (shaded)."""
    for i, x in enumerate(tl.sessions):
        ax.axvline(x, color="#555555", linestyle="--", linewidth=0.9)
        ax.text(
            x,
            1.0,
            f" session {i + 2}",
            transform=ax.get_xaxis_transform(),
            fontsize=7,
            color="#555555",
            va="top",
        )
    for left, right in tl.idle:
        ax.axvspan(left, right, color="#cccccc", alpha=0.4, linewidth=0)
