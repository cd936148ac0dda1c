"""The training checkpoint: center weights, the server's optimizer state, clock, last applied
batch and the ledger, in one file.

It is written atomically (a temporary file, fsync, rename, fsync of the folder) after every
micro-batch, before Spark commits the batch, so after a crash it always describes a whole
number of batches: a batch Spark replays is either absent from it (and trained
again) or present (and skipped).

The last ``keep`` generations stay beside it as ``state.<batch id>.npz`` (hard links: the
newest costs no space), so that a run can go back to one saved before a damaged file or
a model that diverged (:func:`rewind`); so does the one with the best held-out score
(``pinned``), however long ago, for a model whose score collapsed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import io
import json
import os
import re
import shutil
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, DataError, StreamtrainError


class CheckpointError(StreamtrainError):
    """The checkpoint could not be written (the batch stays uncommitted)."""


FILENAME = "state.npz"
#: Generations kept by default (``--keep-checkpoints``).
KEEP = 3
_GENERATION = re.compile(r"^state\.(\d+)\.npz$")
_OPT = "optimizer."  # the prefix of the optimizer's arrays in the file


@dataclasses.dataclass
class State:
    """What a run has applied.

    Attributes:
        weights: the parameter server's center weights.
        clock: updates applied.
        last_batch_id: the last micro-batch applied (-1: none).
        ledger: ``[batch_id, topic, partition, start, end]`` of every range trained
            (compacted: see :func:`pipeline.train.ledger.compact`).
        extra: anything else worth resuming (counts, accuracy history).
        optimizer: the server-side optimizer's arrays (synchronous SGD), by name.
    """

    weights: np.ndarray
    clock: int = 0
    last_batch_id: int = -1
    ledger: list[list[Any]] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    optimizer: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def generation_path(folder: str | os.PathLike[str], batch_id: int) -> Path:
    return Path(folder) / f"state.{batch_id}.npz"


def generations(folder: str | os.PathLike[str]) -> list[int]:
    """The batch ids of the generations kept in ``folder``, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for p in folder.iterdir() if (m := _GENERATION.match(p.name)))


def save(
    folder: str | os.PathLike[str],
    state: State,
    *,
    keep: int = KEEP,
    pinned: int | Sequence[int] | None = None,
) -> Path:
    """Write ``state`` to ``folder/state.npz`` atomically, and keep it as a generation
    (the ``keep`` newest stay, and those ``pinned``: the one with the best held-out score,
    those from just before a drift)."""
    pins = {pinned} if isinstance(pinned, int) else set(pinned or ())
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {
        "clock": state.clock,
        "last_batch_id": state.last_batch_id,
        "ledger": state.ledger,
        "extra": state.extra,
    }
    buf = io.BytesIO()
    arrays = {
        "weights": state.weights,
        "meta": np.frombuffer(json.dumps(meta).encode(), np.uint8),
        **{f"{_OPT}{k}": v for k, v in state.optimizer.items()},
    }
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    tmp, target = folder / f".{FILENAME}.tmp", folder / FILENAME
    try:
        with open(tmp, "wb") as f:
            f.write(buf.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        if keep > 0 and state.last_batch_id >= 0:
            kept = generation_path(folder, state.last_batch_id)
            kept.unlink(missing_ok=True)  # a batch saved again (replayed after a crash)
            os.link(tmp, kept)
        os.replace(tmp, target)
        # The rename is durable only once the folder's entry is: without this, a power cut
        # could bring back the previous checkpoint after Spark committed the new batch.
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:  # a full disk, a quota, a folder gone read-only
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise CheckpointError(
            f"Could not write the checkpoint {target} ({e.strerror or e}): batch "
            f"{state.last_batch_id} is not committed, and the previous checkpoint is intact. Free "
            "space there (or fix the folder), then continue with: streamtrain run --resume "
            f"{folder}"
        ) from None
    for old in generations(folder)[:-keep] if keep > 0 else []:
        if old in pins:
            continue
        with contextlib.suppress(OSError):
            generation_path(folder, old).unlink()
    return target


def check_fits(state: State, size: int, folder: str | os.PathLike[str]) -> None:
    """Refuse a checkpoint whose weights are not ``size`` (the model's), before anything is
    loaded from it.

    >>> import numpy as np
    >>> check_fits(State(np.zeros(3, np.float32)), 5, "run")  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: The checkpoint run/state.npz holds 3 weights, the model has 5:
    another model wrote it. Resume with that model (the run's --dataset and --model), or start a new
    run with another --out.
    """
    if state.weights.size != size:
        raise ConfigError(
            f"The checkpoint {Path(folder) / FILENAME} holds {state.weights.size:,} weights, the "
            f"model has {size:,}: another model wrote it. Resume with that model (the run's "
            "--dataset and --model), or start a new run with another --out."
        )


def load(folder: str | os.PathLike[str], *, generation: int | None = None) -> State | None:
    """The state saved in ``folder`` (or its kept ``generation``), or None if there is none.

    Raises:
        DataError: the file is damaged (one line naming it, what is wrong, and the newest
            intact generation to resume from instead).
    """
    folder = Path(folder)
    path = folder / FILENAME if generation is None else generation_path(folder, generation)
    if generation is not None and not path.is_file():
        raise DataError(
            f"Expected generation {generation} of the checkpoint in {folder}. Received: "
            f"{_listing(folder)}. Pass one of those to --generation."
        )
    if not path.is_file():
        return None
    try:
        return _read(path)
    except DataError as e:
        intact = [
            g
            for g in reversed(generations(folder))
            if g != generation and _intact(generation_path(folder, g))
        ]
        way = (
            f"resume from the newest intact one with: streamtrain run --resume {folder} "
            f"--generation {intact[0]}"
            if intact
            else "no intact generation is kept; start a new run (another --out)"
        )
        raise DataError(f"{e}; {way}") from None


def data_as_of(folder: str | os.PathLike[str]) -> float | None:
    """The freshness bound of the checkpoint in ``folder`` (Unix seconds: the center holds
    every partition's data up to it, :mod:`pipeline.train.freshness`), read without its
    weights; None where there is none, or none readable (a file being replaced: ask again)."""
    try:
        with np.load(Path(folder) / FILENAME, allow_pickle=False) as f:
            meta = json.loads(f["meta"].tobytes())
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError):
        return None
    as_of = (meta.get("extra", {}).get("freshness") or {}).get("as_of")
    return None if as_of is None else float(as_of)


def _read(path: Path) -> State:
    try:
        with np.load(path, allow_pickle=False) as f:
            weights, meta = f["weights"], json.loads(f["meta"].tobytes())
            optimizer = {k[len(_OPT) :]: f[k] for k in f.files if k.startswith(_OPT)}
        return State(
            weights,
            meta["clock"],
            meta["last_batch_id"],
            meta["ledger"],
            meta.get("extra", {}),
            optimizer,
        )
    except (zipfile.BadZipFile, EOFError) as e:
        what = "empty" if path.stat().st_size == 0 else f"truncated or corrupt ({e})"
        raise DataError(f"The checkpoint {path} is damaged: {what}") from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DataError(f"The checkpoint {path} is damaged: {type(e).__name__}: {e}") from None


def _intact(path: Path) -> bool:
    try:
        _read(path)
    except DataError:
        return False
    return True


def _listing(folder: Path) -> str:
    kept = generations(folder)
    return f"generations {', '.join(map(str, kept))}" if kept else "no generation kept"


def rewind(
    folder: str | os.PathLike[str], generation: int, spark_checkpoint: str | os.PathLike[str]
) -> State:
    """Go back to a kept generation: it becomes ``state.npz``, the later generations are
    removed, and Spark's offset and commit logs forget the batches after it, so that Spark
    plans them again from that generation's offsets (every record trained once, counted
    from the state rewound to)."""
    folder = Path(folder)
    state = load(folder, generation=generation)
    assert state is not None
    for later in generations(folder):
        if later > generation:
            generation_path(folder, later).unlink()
    for log in ("offsets", "commits"):
        entries = Path(spark_checkpoint) / log
        for entry in entries.iterdir() if entries.is_dir() else []:
            name = entry.name.lstrip(".").split(".")[0]
            if name.isdigit() and int(name) > generation:
                entry.unlink()
    tmp = folder / f".{FILENAME}.rewind"
    shutil.copyfile(generation_path(folder, generation), tmp)
    os.replace(tmp, folder / FILENAME)
    return state


@contextlib.contextmanager
def lock(folder: str | os.PathLike[str]) -> Iterator[None]:
    """Hold ``folder/.lock`` (an exclusive ``flock``, released if the process dies) while
    a run writes there: two runs must never write one checkpoint.

    Raises:
        ConfigError: another process holds it.
    """
    path = Path(folder) / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ConfigError(
                f"Expected {folder} to be free. Received: a folder another run is writing (pid "
                f"{holder}). Stop that run, or pass another --out."
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
