"""``batches.jsonl`` kept to a bounded size: a trainer that runs for months keeps a record of
its whole run, at a resolution that coarsens with age.

Rows are appended as batches end. When the file passes its bound, the newest half of the
bound's bytes stays as written and the rows before it are merged in pairs, as often as it
takes to fit a quarter of the bound: counts and seconds summed, scores averaged over the
records they were taken on, events (drifts, passed-over batches) kept, per-task rows dropped.
The first row stays first, so the report's picture still starts where the run started, and
every total over the rows (records trained, rejected, seconds) is the run's.

Example:
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "batches.jsonl"
    >>> for i in range(400):
    ...     append_row(path, {"batch_id": i, "t": float(i), "trained": 10, "tasks": [1] * 8},
    ...                max_bytes=8_000)
    >>> rows = read_all(path)
    >>> path.stat().st_size <= 8_000, rows[0]["batch_id"], rows[-1]["batch_id"]
    (True, 0, 399)
    >>> sum(r["trained"] for r in rows)
    4000
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

#: The bound: some 60,000 recent batches as written, and the whole run before them coarser.
MAX_BYTES = 64 << 20
#: Summed when two rows merge (counts and seconds); the other fields are the later row's.
_SUMMED = (
    "rows",
    "trained",
    "aborted",
    "held_out",
    "batch_s",
    "compute_s",
    "exchange_s",
    "read_decode_s",
    "task_s",
    "commit_s",
    "checkpoint_ms",
)
#: Scores averaged over the records trained: the batches' own test-then-train figures.
_AVERAGED = ("prequential_accuracy", "prequential_loss")
#: Events: every one kept.
_EVENTS = ("drifts", "poison")


def append_row(path: Path, row: dict[str, Any], *, max_bytes: int = MAX_BYTES) -> None:
    """Append ``row`` to ``path`` as one JSON line; compact the file once it passes
    ``max_bytes``."""
    with open(path, "a") as f:
        f.write(json.dumps(row, default=float) + "\n")
        size = f.tell()
    if size > max_bytes:
        compact(path, max_bytes=max_bytes)


def read_all(path: Path) -> list[dict[str, Any]]:
    """Every whole row of ``path`` (a line a kill cut short is left out)."""
    rows = []
    with open(path, "rb") as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return rows


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two consecutive rows as one, at the later one's time.

    >>> merge({"trained": 2, "prequential_accuracy": 0.5, "rejected": {"x": 1}, "lag": 9},
    ...       {"trained": 6, "prequential_accuracy": 0.9, "rejected": {"x": 2}, "lag": 3})
    {'trained': 8, 'prequential_accuracy': 0.8, 'rejected': {'x': 3}, 'lag': 3, 'batches': 2}
    """
    out = dict(b)
    for key in _SUMMED:
        if key in a or key in b:
            out[key] = (a.get(key) or 0) + (b.get(key) or 0)
    wa, wb = float(a.get("trained") or 0), float(b.get("trained") or 0)
    for key in _AVERAGED:
        va, vb = a.get(key), b.get(key)
        if va is not None and vb is not None and wa + wb > 0:
            out[key] = (va * wa + vb * wb) / (wa + wb)
        elif vb is None and va is not None:
            out[key] = va
    if "rejected" in a or "rejected" in b:
        rejected = dict(a.get("rejected") or {})
        for reason, n in (b.get("rejected") or {}).items():
            rejected[reason] = rejected.get(reason, 0) + n
        out["rejected"] = rejected
    for key in _EVENTS:
        if a.get(key) or b.get(key):
            out[key] = list(a.get(key) or []) + list(b.get(key) or [])
    if b.get("heldout") is None and a.get("heldout") is not None:
        out["heldout"] = a["heldout"]  # a scored point is kept, at the pair's time
    out.pop("tasks", None)
    out["batches"] = int(a.get("batches", 1)) + int(b.get("batches", 1))
    return out


def _encoded(rows: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(r, default=float) + "\n" for r in rows]


def compact(path: Path, *, max_bytes: int = MAX_BYTES) -> None:
    """Rewrite ``path`` within ``max_bytes``: its newest half as written, the rows before
    merged in pairs until they fit a quarter (the first row kept first). Atomic: a reader
    sees the old file or the new one."""
    rows = read_all(path)
    lines = _encoded(rows)
    recent, size = len(lines), 0  # rows[recent:] stay as written: the newest half
    while recent > 1 and size + len(lines[recent - 1]) <= max_bytes // 2:
        recent -= 1
        size += len(lines[recent])
    rest = rows[1:recent]  # the first row stays first; these merge
    older = lines[1:recent]
    while len(rest) > 1 and sum(map(len, older)) > max_bytes // 4:
        merged = [merge(rest[i], rest[i + 1]) for i in range(0, len(rest) - 1, 2)]
        rest = merged + rest[len(merged) * 2 :]
        older = _encoded(rest)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.writelines([*lines[:1], *older, *lines[recent:]])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
