"""A model that diverged or collapsed, stopped: the error that says so before the batch is
saved or committed, and the way back to a kept checkpoint generation.

:class:`~pipeline.train.driver.TrainDriver` checks each batch with :func:`check_finite`
(before the save) and :func:`check_heldout` (as the batch is scored, after its save); what
each finds is measured by :class:`~pipeline.train.divergence.HeldoutWatch`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from pipeline.errors import StreamtrainError
from pipeline.train import checkpoint
from pipeline.train.divergence import HeldoutWatch
from pipeline.train.rows import BatchRow


def check_finite(
    batch_id: int,
    weights: np.ndarray,
    row: BatchRow,
    *,
    watch: HeldoutWatch | None,
    folder: Path | None,
) -> None:
    """Stop a model that diverged before its weights are saved or served: a prequential
    loss that is NaN or Inf, or absurd (past the watch's
    :attr:`~pipeline.train.divergence.HeldoutWatch.loss_bound`), or a center that is not
    finite (a rule's own state blew up)."""
    loss = row.prequential_loss  # None: nothing trained in this batch (all rejected, or none)
    bound = watch.loss_bound if watch is not None else math.inf
    if (loss is None or math.isfinite(loss) and loss <= bound) and np.isfinite(weights).all():
        return
    if loss is not None and math.isfinite(loss) and loss > bound:
        assert watch is not None
        what = (
            f"prequential loss {loss:.4g}, over "
            f"{watch.loss_bound / watch.loss_reference:,.0f} times what predicting "
            f"without the features costs, {watch.loss_reference:.4g}"
        )
    else:
        what = (
            f"prequential loss {loss}"
            if loss is not None and not math.isfinite(loss)
            else "weights not finite"
        )
    diverged(batch_id, what, folder=folder)


def diverged(batch_id: int, what: str, *, folder: Path | None) -> None:
    """Raise: batch ``batch_id``'s model diverged (``what``), and how to go on."""
    raise StreamtrainError(
        f"Batch {batch_id}: the model diverged ({what}); the batch is not saved or committed. "
        f"Lower the learning rate (or check the data), then {way_back(folder)}."
    )


def check_heldout(
    batch_id: int,
    scores: dict[str, float],
    *,
    watch: HeldoutWatch | None,
    folder: Path | None,
) -> None:
    """Stop a model whose held-out score collapsed (:class:`HeldoutWatch`), before Spark
    commits the batch: the checkpoint holds it, so the way on is the generation of the
    best score."""
    collapsed = watch.observe(batch_id, scores) if watch is not None else None
    if collapsed is None:
        return
    raise StreamtrainError(
        f"Batch {batch_id}: the model collapsed ({collapsed}); the batch is not committed. "
        "Check the data (its labels) and the learning rate, then "
        f"{way_back(folder, watch.best_batch if watch else -1)} (or add "
        "--no-divergence-check to train on regardless)."
    )


def way_back(folder: Path | None, sound: int = -1) -> str:
    """How to continue from a kept generation: ``sound`` if it is kept, else the newest."""
    kept = checkpoint.generations(folder) if folder is not None else []
    if not kept:
        return "start again (another --out)"
    pick = sound if sound in kept else kept[-1]
    return (
        f"continue from batch {pick}'s checkpoint with: streamtrain run --resume "
        f"{folder} --generation {pick} (kept: {', '.join(map(str, kept))})"
    )
