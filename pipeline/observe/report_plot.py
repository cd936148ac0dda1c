"""A run's report picture: accuracy, throughput, staleness and lag over seconds of streaming.
matplotlib with the Agg backend (no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
    acc.text(0.99, 0.02, "\n".join(measured), ha="right", va="bottom", fontsize=7, color="#555555",
             transform=acc.transAxes)
    acc.set_title("Accuracy", loc="left")
    acc.set_ylim(0, 1)

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

    p50 = [(x, b["staleness_p50"]) for x, b in zip(t, history, strict=True) if b.get("staleness_p50") is not None]
    p99 = [(x, b["staleness_p99"]) for x, b in zip(t, history, strict=True) if b.get("staleness_p99") is not None]
    if p50:
        stal.plot(*zip(*p50, strict=True), label="p50", linewidth=1.2)
        stal.plot(*zip(*p99, strict=True), label="p99", linewidth=1.2)
    stal.set_title("Staleness (updates between a worker's pull and push)", loc="left")

    lag.plot(t, [b["lag"] for b in history], linewidth=1.2, color="tab:red")
    lag.set_title("Consumer lag (records in Kafka not yet trained)", loc="left")

    for ax in axes.flat:
        ax.set_xlabel("seconds of streaming")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        if not ax.lines:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="#888888")
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return {"prequential": len(pre), "held-out": len(held), "throughput": len(t), "staleness": len(p50),
            "lag": len(t)}
