"""A run's batches on one clock across its sessions: where each batch lies, where a session
began, and where the stream was idle, so that a picture draws gaps as gaps.

A row's ``t`` counts from its own process's start; ``at`` (Unix time at the batch's end) puts
every session's rows on one clock. Rows written before ``at`` existed are laid session after
session, by their ``t_stream``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

#: A wait this long between the end of a batch and the start of the next (and longer than
#: that batch took) is an idle stream, drawn as a gap: a trainer keeping up waits well under
#: a second, and a stream that sends a batch a minute is idle in between.
IDLE_GAP_S = 30.0
#: Two rows' clocks (``t``, ``at``) this far apart come from two processes.
_CLOCKS_APART_S = 1.0


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Where a run's rows lie in time.

    Attributes:
        x: each row's end, in seconds since the run's first batch began.
        start: each row's start: the end of the batch before it, or (after a break) its end
            minus its own duration.
        breaks: whether a line breaks before each row (a new session, or an idle gap).
        sessions: where each session after the first began (its first batch's start).
        idle: ``(from, to)`` of each idle gap inside a session.
    """

    x: np.ndarray
    start: np.ndarray
    breaks: np.ndarray
    sessions: list[float]
    idle: list[tuple[float, float]]

    def gapped(self, values: Sequence[float | None]) -> tuple[np.ndarray, np.ndarray]:
        """``x`` and ``values`` with a NaN at each break, so that a line stops there (and at
        each None: a value not measured).

        >>> tl = timeline(
        ...     [
        ...         {"t": 1.0, "at": 101.0, "batch_s": 1.0},
        ...         {"t": 2.0, "at": 102.0, "batch_s": 1.0},
        ...         {"t": 1.0, "at": 500.0, "batch_s": 1.0},
        ...     ]
        ... )
        >>> tl.gapped([5, 6, 7])
        (array([  1.,   2.,  nan, 400.]), array([ 5.,  6., nan,  7.]))
        """
        xs: list[float] = []
        ys: list[float] = []
        for i, (x, v) in enumerate(zip(self.x, values, strict=True)):
            if i and self.breaks[i]:
                xs.append(float("nan"))
                ys.append(float("nan"))
            xs.append(float(x))
            ys.append(float("nan") if v is None else float(v))
        return np.array(xs), np.array(ys)


def timeline(rows: Sequence[dict[str, Any]], *, idle_gap_s: float = IDLE_GAP_S) -> Timeline:
    """Place ``rows`` (``batches.jsonl``'s, every session's, oldest first) on one clock.

    A session begins where ``t`` goes back (a new process). Inside one, a wait before a
    batch longer than ``idle_gap_s`` and than the batch itself is an idle gap.

    Example:
        >>> rows = [
        ...     {"t": 5.0, "at": 1005.0, "batch_s": 2.0},
        ...     {"t": 7.0, "at": 1007.0, "batch_s": 2.0},
        ...     {"t": 200.0, "at": 1200.0, "batch_s": 2.0},  # 191 s idle before it
        ...     {"t": 4.0, "at": 2000.0, "batch_s": 1.0},
        ... ]  # a new session
        >>> tl = timeline(rows)
        >>> tl.x.tolist(), tl.breaks.tolist(), tl.sessions, tl.idle
        ([2.0, 4.0, 197.0, 997.0], [False, False, True, True], [996.0], [(4.0, 195.0)])
        >>> timeline(
        ...     [{"t": 5.0, "at": 1005.0, "batch_s": 2.0}, {"t": 9.0, "at": 1050.0, "batch_s": 2.0}]
        ... ).sessions
        [45.0]
    """
    n = len(rows)
    ends = np.zeros(n)
    took = np.array([float(r.get("batch_s") or 0.0) for r in rows])
    t = np.array([float(r.get("t", 0.0)) for r in rows])
    new_session = np.concatenate([[False], t[1:] < t[:-1]]) if n else np.zeros(0, dtype=bool)
    if n and all(r.get("at") for r in rows):
        ends = np.array([float(r["at"]) for r in rows])
        # A process's two clocks move together; where the wall clock went further than ``t``,
        # another process wrote the row (a short session's ``t`` need not go back).
        new_session[1:] |= np.abs(np.diff(ends) - np.diff(t)) > _CLOCKS_APART_S
    else:  # older rows: sessions end to end, each on its own streaming clock
        offset = 0.0
        for i, r in enumerate(rows):
            if new_session[i]:
                offset = ends[i - 1] + took[i]
            ends[i] = offset + float(r.get("t_stream", r.get("t", 0.0)))
    origin = ends[0] - took[0] if n else 0.0
    x = ends - origin
    starts = x - took
    breaks = new_session.copy()
    idle = []
    for i in range(1, n):
        wait = starts[i] - x[i - 1]
        if not new_session[i] and wait > max(idle_gap_s, took[i]):
            breaks[i] = True
            idle.append((float(x[i - 1]), float(starts[i])))
    start = np.where(breaks | (np.arange(n) == 0), starts, np.concatenate([[0.0], x[:-1]]))
    sessions = [float(starts[i]) for i in range(n) if new_session[i]]
    return Timeline(x=x, start=start, breaks=breaks, sessions=sessions, idle=idle)


def duration_label(seconds: float, _pos: object = None) -> str:
    """Seconds as a tick label, in the unit that keeps it short.

    >>> [duration_label(v) for v in (0, 45, 600, 5400, 90_000, 400_000)]
    ['0 s', '45 s', '10 min', '90 min', '25 h', '4.6 d']
    """
    for div, unit, most in ((1, "s", 600), (60, "min", 7200), (3600, "h", 172_800)):
        if abs(seconds) < most:
            return f"{seconds / div:.3g} {unit}"
    return f"{seconds / 86_400:.2g} d"
