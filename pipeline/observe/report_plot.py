"""A run's report picture: accuracy, throughput, staleness and lag over seconds of streaming.
matplotlib with the Agg backend (no display needed)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

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
    return max(0.0, math.floor((low - pad) * 200) / 200), min(1.0, math.ceil((high + pad) * 200) / 200)


def report_plots(history: list[dict[str, Any]], out: str | Path, *, title: str = "",
                 final: float | None = None, eval_every: int | None = None,
                 eval_records: int | None = None) -> dict[str, int]:
    """Accuracy, throughput, staleness and lag of a run, against seconds of streaming.

    Held-out accuracy is drawn wherever it was measured: the scored batches, and
    ``final`` (the score after the last batch) at the end, so that a run shorter than
    ``eval_every`` batches still shows one; the panel says what was measured how often.
    Returns the number of points drawn per series (what a test can check).
    """
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(2, 2, figsize=(13, 8), layout="constrained")
    fig.suptitle(title or "streamtrain run", fontsize=13)
    t = np.array([b.get("t_stream", b["t"]) for b in history], dtype=float)
    (acc, thr), (stal, lag) = axes

    pre = [(x, b["prequential_accuracy"]) for x, b in zip(t, history, strict=True) if "prequential_accuracy" in b]
    held = [(x, b["heldout"]["accuracy"]) for x, b in zip(t, history, strict=True) if "heldout" in b]
    if pre:
        acc.plot(*zip(*pre, strict=True), label="prequential (batch scored before training)", linewidth=1, alpha=0.7)
    if final is not None and len(t) and not (held and held[-1][0] == t[-1] and held[-1][1] == final):
        held.append((float(t[-1]), final))
    if held:
        acc.plot(*zip(*held, strict=True), "o-", label="held-out", linewidth=1.5, markersize=4)
    measured = ["prequential: every training step's batch, before it trains"]
    if eval_every is not None:
        split = f" on {eval_records:,} records" if eval_records else ""
        measured.append(f"held-out: every {eval_every} batches and at the end{split}")
    acc.set_title("Accuracy", loc="left")
    low, high = accuracy_limits([v for _, v in pre], [v for _, v in held])
    acc.set_ylim(low, high)
    if low > 0 and any(v < low for _, v in pre):
        measured.append(f"axis from {low:g}: the first batches' lower scores run off the bottom")

    # Records per second over each batch's span (from the end of the one before).
    spans = np.diff(np.concatenate([[0.0], t]))
    trained = np.array([b["trained"] for b in history], dtype=float)
    per_batch = np.divide(trained, spans, out=np.zeros_like(trained), where=spans > 0)
    thr.plot(t, per_batch, linewidth=0.8, alpha=0.5, label="per batch")
    if len(t) >= 5:  # five batches' records over their span: steadier than one batch
        window = np.array([trained[max(0, i - 4):i + 1].sum() / (t[i] - (t[i - 5] if i >= 5 else 0.0))
                           for i in range(len(t))])
        thr.plot(t, window, linewidth=1.6, label="over 5 batches")
    thr.set_title("Throughput (records trained per second)", loc="left")
    thr.set_ylim(0, max(1.0, float(per_batch.max(initial=0))) * 1.15)

    p50 = [(x, b["staleness_p50"]) for x, b in zip(t, history, strict=True) if b.get("staleness_p50") is not None]
    p99 = [(x, b["staleness_p99"]) for x, b in zip(t, history, strict=True) if b.get("staleness_p99") is not None]
    if p50:
        stal.plot(*zip(*p50, strict=True), label="p50", linewidth=1.2)
        stal.plot(*zip(*p99, strict=True), label="p99", linewidth=1.2)
    stal.set_title("Staleness (updates between a worker's pull and push)", loc="left")
    stal.set_ylim(0, max([1.0, *(v for _, v in p99)]) * 1.15)

    lag.plot(t, [b["lag"] for b in history], linewidth=1.2, color="tab:red")
    lag.set_title("Consumer lag (records in Kafka not yet trained)", loc="left")
    lag.set_ylim(bottom=0)

    for ax in (thr, lag):  # 1.07M on the tick itself, not "1e6" above the axis
        ax.yaxis.set_major_formatter(FuncFormatter(count_label))
    for ax in axes.flat:
        ax.set_xlabel("seconds of streaming")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0] and ax is acc:  # above the plot, right of its title: off the data
            ax.legend(fontsize=8, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, frameon=False,
                      borderaxespad=0.2)
        elif ax.get_legend_handles_labels()[0]:  # the axis has a margin above the data for it
            ax.legend(fontsize=8, loc="upper right", ncol=2)
        if not ax.lines:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="#888888")
    acc.set_xlabel("seconds of streaming\n" + "\n".join(measured), fontsize=8, color="#555555")
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return {"prequential": len(pre), "held-out": len(held), "throughput": len(t), "staleness": len(p50),
            "lag": len(t)}
