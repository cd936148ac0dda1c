"""The ID tables in the checkpoint: each batch's changed rows beside it, and a full snapshot
every so often, so that a resume loads one snapshot and the deltas after it, not a month
of deltas.

Each batch writes ``tables/<batch id>.npz`` (atomically, before the checkpoint that names
it), a delta or a snapshot; the checkpoint's ``extra["tables"]`` holds the chain that
rebuilds the tables (a snapshot's batch id, then the deltas' after it) and the tables'
clock. A file that no checkpoint names yet (a crash between the two writes) is written
again when its batch is replayed. Files older than the snapshot before the newest go.

Example:
    >>> import tempfile
    >>> from pipeline.train.ps.rows import RowSpec
    >>> from pipeline.train.row_servers import RowServers
    >>> folder = tempfile.mkdtemp()
    >>> with RowServers([RowSpec("item", dim=2)], secret=b"s", host="127.0.0.1") as rows:
    ...     entry = save(folder, 0, rows, None)
    ...     entry = save(folder, 1, rows, entry)
    >>> entry["chain"], sorted(p.name for p in (Path(folder) / "tables").iterdir())
    ([0, 1], ['0.npz', '1.npz'])
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.train.checkpoint import CheckpointError
from pipeline.train.ps.rows import SHARED, shard_of

#: Deltas after which the next batch writes a snapshot instead.
SNAPSHOT_EVERY = 50
_FIELDS = ("keys", "values", "accum", "last_seen")
_PENDING = ("keys", "seen", "last_seen")


def _path(folder: str | os.PathLike[str], batch_id: int) -> Path:
    return Path(folder) / "tables" / f"{batch_id}.npz"


def save(
    folder: str | os.PathLike[str], batch_id: int, rows: Any, entry: dict[str, Any] | None
) -> dict[str, Any]:
    """Write the tables' changes of batch ``batch_id`` (a snapshot when due) and return the
    checkpoint's new entry, given its last one (None: the run's first)."""
    chain = list((entry or {}).get("chain", []))
    if chain and chain[-1] == batch_id:  # the batch replayed after a crash: its file again
        chain.pop()
    snapshot = not chain or len(chain) > SNAPSHOT_EVERY
    changes = rows.changes(snapshot=snapshot)
    arrays: dict[str, np.ndarray] = {"snapshot": np.array([snapshot])}
    for s, shard in enumerate(changes):
        for t, change in enumerate(shard):
            at = f"{s}.{t}."
            for k in _FIELDS:
                arrays[f"{at}rows.{k}"] = change["rows"][k]
            arrays[f"{at}dropped"] = change["dropped"]
            for k in _PENDING:
                arrays[f"{at}pending.{k}"] = change["pending"][k]
    _write(_path(folder, batch_id), arrays)
    chain = [batch_id] if snapshot else [*chain, batch_id]
    if snapshot and entry:
        _prune(folder, keep_from=(entry.get("chain") or [batch_id])[0])
    return {"chain": chain, "now": rows.now}


def restore(folder: str | os.PathLike[str], rows: Any, entry: dict[str, Any] | None) -> int:
    """Rebuild ``rows`` from the chain a checkpoint names; returns the batches read. The files
    may come from another number of shards (``--ps-shards`` changed on resume): each row goes
    to the shard its key names now."""
    if not entry:
        return 0
    shards, tables = rows.shards, len(rows.specs)
    for batch_id in entry["chain"]:
        path = _path(folder, batch_id)
        try:
            with np.load(path) as f:
                data = {k: f[k] for k in f.files}
        except (OSError, ValueError) as e:
            raise CheckpointError(
                f"The checkpoint's ID tables need {path}, which cannot be read ({e}); resume "
                "from the run's folder as it was written, or start a new run."
            ) from None
        snapshot = bool(data["snapshot"][0])
        written = sum(1 for k in data if k.endswith(".0.dropped"))  # shards when it was saved
        owner = int(shard_of(np.array([SHARED], np.uint64), written)[0])
        changes: list[list[dict[str, Any]]] = [[] for _ in range(shards)]
        for t in range(tables):
            parts = [_change(data, f"{s}.{t}.", snapshot) for s in range(written)]
            for s, part in enumerate(parts):  # only the owner's shared row is the table's
                if s != owner:
                    keep = part["rows"]["keys"] != SHARED
                    part["rows"] = {k: v[keep] for k, v in part["rows"].items()}
            merged = _merge(parts, snapshot)
            for s, mine in enumerate(_split(merged, shards)):
                changes[s].append(mine)
        rows.load(changes, now=int(entry["now"]))
    return len(entry["chain"])


def _merge(parts: list[dict[str, Any]], snapshot: bool) -> dict[str, Any]:
    return {
        "snapshot": snapshot,
        "rows": {k: np.concatenate([p["rows"][k] for p in parts]) for k in _FIELDS},
        "dropped": np.concatenate([p["dropped"] for p in parts]),
        "pending": {k: np.concatenate([p["pending"][k] for p in parts]) for k in _PENDING},
    }


def _split(change: dict[str, Any], shards: int) -> list[dict[str, Any]]:
    """A table's change cut into the part of each of ``shards`` by key."""
    at = {
        "rows": shard_of(change["rows"]["keys"], shards),
        "dropped": shard_of(change["dropped"], shards),
        "pending": shard_of(change["pending"]["keys"], shards),
    }
    return [
        {
            "snapshot": change["snapshot"],
            "rows": {k: v[at["rows"] == s] for k, v in change["rows"].items()},
            "dropped": change["dropped"][at["dropped"] == s],
            "pending": {k: v[at["pending"] == s] for k, v in change["pending"].items()},
        }
        for s in range(shards)
    ]


def _change(data: dict[str, np.ndarray], at: str, snapshot: bool) -> dict[str, Any]:
    return {
        "snapshot": snapshot,
        "rows": {k: data[f"{at}rows.{k}"] for k in _FIELDS},
        "dropped": data[f"{at}dropped"],
        "pending": {k: data[f"{at}pending.{k}"] for k in _PENDING},
    }


def _write(target: Path, arrays: dict[str, np.ndarray]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(buf.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise CheckpointError(
            f"Could not write the ID tables' checkpoint {target} ({e.strerror or e}): the batch "
            "is not committed. Free space there, then continue with --resume."
        ) from None


def _prune(folder: str | os.PathLike[str], *, keep_from: int) -> None:
    """Drop the files of batches before ``keep_from`` (the previous snapshot's)."""
    for path in (Path(folder) / "tables").glob("*.npz"):
        with contextlib.suppress(ValueError, OSError):
            if int(path.stem) < keep_from:
                path.unlink()
