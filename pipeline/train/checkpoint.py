"""The training checkpoint: center weights, the server's optimizer state, clock, last applied
batch and the ledger, in one file.

It is written atomically (a temporary file, fsync, rename, fsync of the folder) after every micro-batch,
before Spark commits the batch, so after a crash it always describes a whole
number of batches: a batch Spark replays is either absent from it (and trained
again) or present (and skipped).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, DataError, StreamtrainError


class CheckpointError(StreamtrainError):
    """The checkpoint could not be written (the batch stays uncommitted)."""

FILENAME = "state.npz"
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


def save(folder: str | os.PathLike[str], state: State) -> Path:
    """Write ``state`` to ``folder/state.npz`` atomically."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"clock": state.clock, "last_batch_id": state.last_batch_id, "ledger": state.ledger, "extra": state.extra}
    buf = io.BytesIO()
    arrays = {"weights": state.weights, "meta": np.frombuffer(json.dumps(meta).encode(), np.uint8),
              **{f"{_OPT}{k}": v for k, v in state.optimizer.items()}}
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    tmp, target = folder / f".{FILENAME}.tmp", folder / FILENAME
    try:
        with open(tmp, "wb") as f:
            f.write(buf.getbuffer())
            f.flush()
            os.fsync(f.fileno())
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
            f"Could not write the checkpoint {target} ({e.strerror or e}): batch {state.last_batch_id} is not "
            f"committed, and the previous checkpoint is intact. Free space there (or fix the folder), then "
            f"continue with: streamtrain run --resume {folder}") from None
    return target


def check_fits(state: State, size: int, folder: str | os.PathLike[str]) -> None:
    """Refuse a checkpoint whose weights are not ``size`` (the model's), before anything is
    loaded from it.

    >>> import numpy as np
    >>> check_fits(State(np.zeros(3, np.float32)), 5, "run")
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: The checkpoint run/state.npz holds 3 weights, the model has 5: another model wrote it. Resume with that model (the run's --dataset and --model), or start a new run with another --out.
    """
    if state.weights.size != size:
        raise ConfigError(
            f"The checkpoint {Path(folder) / FILENAME} holds {state.weights.size:,} weights, the model has {size:,}: "
            "another model wrote it. Resume with that model (the run's --dataset and --model), or start a new run "
            "with another --out.")


def load(folder: str | os.PathLike[str]) -> State | None:
    """The state saved in ``folder``, or None if there is none."""
    path = Path(folder) / FILENAME
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as f:
            weights, meta = f["weights"], json.loads(f["meta"].tobytes())
            optimizer = {k[len(_OPT):]: f[k] for k in f.files if k.startswith(_OPT)}
    except (OSError, ValueError, KeyError) as e:
        raise DataError(f"The checkpoint {path} is unreadable ({e}); it cannot be resumed from.") from None
    return State(weights, meta["clock"], meta["last_batch_id"], meta["ledger"], meta.get("extra", {}), optimizer)
