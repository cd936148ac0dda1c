"""The freshness benchmark's figures from a run's batches (``batches.jsonl`` rows): the
model's freshness over time, an arm's capacity on its backlog, a batch's cost beyond its
compute (:mod:`freshness`)."""

from __future__ import annotations

from typing import Any

import numpy as np

#: Seconds between the freshness series' samples.
STEP_S = 0.1


def freshness_series(rows: list[dict[str, Any]], start: float, end: float) -> np.ndarray:
    """The model's freshness every STEP_S from ``start`` to ``end`` (Unix seconds), from the
    batches' rows: NaN before the first batch that learned anything.

    >>> rows = [{"at": 10.0, "data_as_of": 9.0}, {"at": 11.0, "data_as_of": 10.5}]
    >>> [round(float(f), 1) for f in freshness_series(rows, 10.0, 11.3)[::6]]
    [1.0, 1.6, 0.7]
    """
    known = sorted((r["at"], r["data_as_of"]) for r in rows if r.get("data_as_of") is not None)
    ats, as_of = np.array([a for a, _ in known]), np.array([d for _, d in known])
    ts = np.arange(start, end, STEP_S)
    if not len(ats):
        return np.full(len(ts), np.nan)
    idx = np.searchsorted(ats, ts, side="right") - 1
    return np.where(idx >= 0, ts - as_of[np.maximum(idx, 0)], np.nan)


def recovery_s(after: np.ndarray, target: float, window_s: float) -> float:
    """Seconds from a burst's end until the freshness series ``after`` (from that end on) is
    back under ``target`` for good: the end of its last moment over the target within the
    recovery window ``window_s``. A moment over it later (a slow checkpoint minutes on) is the
    steady phase's, counted in its p99, not the burst's. Where the window ends over the
    target, the last moment over it in the whole series (inf: still over at its end). NaN
    (nothing learned yet) counts as over.

    >>> recovery_s(np.array([5.0, 3.0, 1.0, 1.0, 3.0, 1.0]), 2.0, 0.3)  # 3.0 later: steady's
    0.2
    >>> recovery_s(np.array([5.0, 3.0, 3.0, 1.0, 3.0, 1.0]), 2.0, 0.3)  # the window ends over
    0.5
    >>> recovery_s(np.array([1.0, 1.0]), 2.0, 0.1), recovery_s(np.array([3.0, 3.0]), 2.0, 0.1)
    (0.0, inf)
    >>> recovery_s(np.array([]), 2.0, 0.1)  # no series: nothing over the target, as before
    0.0
    """
    over = ~(after <= target)
    window = over[: max(1, round(window_s / STEP_S))]
    last = np.flatnonzero(over if len(window) and window[-1] else window)
    if not len(last):
        return 0.0
    if last[-1] == len(after) - 1:
        return float("inf")
    return round(float(last[-1] + 1) * STEP_S, 3)


def capacity(rows: list[dict[str, Any]], backlog: int) -> float:
    """Records/s over the batches that drained the backlog, the first left out (NaN: fewer
    than three batches did)."""
    drained, upto = 0, 0
    for i, r in enumerate(rows):
        drained += int(r.get("trained", 0))
        upto = i
        if drained >= backlog:
            break
    if upto < 2:
        return float("nan")
    records = sum(int(r.get("trained", 0)) for r in rows[1 : upto + 1])
    return records / max(1e-9, rows[upto]["at"] - rows[0]["at"])


def saturated_rate(rows: list[dict[str, Any]], full: int) -> float:
    """Records/s while the trainer was saturated: over the run of ``full``-record batches
    (each planned at the cap, so records waited for it), from the first one's end to the
    last's; NaN where fewer than three ran back to back.

    >>> rows = [{"at": 0.0, "rows": 500}, {"at": 5.0, "rows": 20_000},
    ...         {"at": 12.0, "rows": 20_000}, {"at": 20.0, "rows": 20_000},
    ...         {"at": 21.0, "rows": 900}]
    >>> saturated_rate(rows, 20_000)
    2666.6666666666665
    """
    best: list[dict[str, Any]] = []
    run: list[dict[str, Any]] = []
    for r in sorted(rows, key=lambda r: r["at"]):
        run = [*run, r] if int(r.get("rows", 0)) >= full else []
        best = run if len(run) > len(best) else best
    if len(best) < 3:
        return float("nan")
    return sum(int(r["rows"]) for r in best[1:]) / max(1e-9, best[-1]["at"] - best[0]["at"])


def overhead(rows: list[dict[str, Any]], windows: list[tuple[float, float]]) -> dict[str, float]:
    """The medians, over the batches that ended within ``windows`` (Unix seconds), of a batch's
    cycle beyond its records' compute (``overhead``) and of its parts: the tasks' time beyond
    compute (reading, the exchange, task launch), the driver's commit, and the gap left
    (trigger, planning, scoring).

    >>> rows = [{"at": 10.0, "batch_s": 0.5, "commit_s": 0.1, "compute_s": 0.6, "tasks": []},
    ...         {"at": 11.0, "batch_s": 0.6, "commit_s": 0.1, "compute_s": 0.8,
    ...          "tasks": [{"worker": 0}, {"worker": 1}]}]
    >>> overhead(rows, [(10.5, 12.0)])
    {'overhead': 0.6, 'tasks_beyond_compute': 0.2, 'commit': 0.1, 'gap': 0.3}
    """
    parts: dict[str, list[float]] = {
        "overhead": [],
        "tasks_beyond_compute": [],
        "commit": [],
        "gap": [],
    }
    ordered = sorted(rows, key=lambda r: r["at"])
    for before, r in zip(ordered, ordered[1:], strict=False):
        if not any(a <= r["at"] < b for a, b in windows):
            continue
        workers = max(1, len({t["worker"] for t in r.get("tasks") or []}))
        compute = float(r.get("compute_s", 0.0)) / workers
        cycle = r["at"] - before["at"]
        parts["overhead"].append(cycle - compute)
        parts["tasks_beyond_compute"].append(float(r.get("batch_s", 0.0)) - compute)
        parts["commit"].append(float(before.get("commit_s", 0.0)))
        parts["gap"].append(
            cycle - float(r.get("batch_s", 0.0)) - float(before.get("commit_s", 0.0))
        )
    return {k: round(float(np.median(v)), 3) if v else float("nan") for k, v in parts.items()}
