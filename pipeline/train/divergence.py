"""A model whose held-out score collapsed: the rule that stops it before it is served on.

A NaN loss or weights that are not finite stop a run at once
(:meth:`~pipeline.train.driver.TrainDriver.check_finite`). A model can also go wrong with
finite numbers: a learning rate too high for the stream, or labels an upstream bug flipped,
drive it back to what predicting the majority class scores, or below. :class:`HeldoutWatch`
measures each held-out score as *skill*, its gain over that trivial predictor's score, and
calls the model collapsed when, after it had learned, the gain falls to a ``share`` of the
best one on ``patience`` scores in a row.

A score on a held-out split of ``n`` records is a sample: accuracy's standard error is
``sqrt(p (1 - p) / n)`` (0.022 for 500 records at 0.6), and the best of fifty such scores
sits about two of them above the truth. So both sides of the rule are confidence bounds
(:data:`Z` standard errors): the model learned when the *lower* bound of its best score
clears the trivial predictor by ``min_gain``, and it collapsed only when even the *upper*
bound of a score is within ``share`` of the learned gain. A stationary stream's scores
wander inside their bounds and never fire; labels that flipped drive the score to the
trivial predictor's or below, far outside them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

#: Of the best gain over the trivial predictor, the share a collapsed model keeps at most.
SHARE = 0.25
#: Scores in a row at or below that share before the run stops.
PATIENCE = 2
#: Standard errors on each side of a score: 3 (a false stop in about a thousand scores of
#: a stationary stream at one side's 0.13%, before PATIENCE asks for two in a row).
Z = 3.0
#: A prequential loss this many times the loss of predicting without the features is a
#: model that blew up (Keras' cross-entropy clips probabilities: a sane one stays under
#: about 16, 23 times ln 2).
LOSS_FACTOR = 10_000


@dataclasses.dataclass
class HeldoutWatch:
    """Watches one held-out score of a run for a collapse.

    Args:
        metric: the score's name in the scores dict (``accuracy``, or ``rmse`` for a target).
        baseline: what the trivial predictor scores on the held-out split (the majority
            class's share; for a numeric target, the RMSE of predicting the mean).
        lower_is_better: True for an error (RMSE).
        min_gain: the gain over the baseline that counts as having learned.
        share: see :data:`SHARE`.
        patience: see :data:`PATIENCE`.
        n: the held-out records a score is measured on (its confidence bounds' width).
        z: see :data:`Z`.
        loss_reference: the loss of predicting without the features (ln of the classes, the
            targets' variance): :attr:`loss_bound` is :data:`LOSS_FACTOR` times it.

    Example:
        >>> w = HeldoutWatch("accuracy", baseline=0.5, min_gain=0.05, n=10_000)
        >>> [w.observe(b, {"accuracy": a}) for b, a in [(0, 0.8), (1, 0.9), (2, 0.52)]]
        [None, None, None]
        >>> w.observe(3, {"accuracy": 0.51})
        'held-out accuracy 0.5100 after 0.9000 at batch 1 (the majority class scores 0.5000)'
        >>> w.best_batch
        1

        On 500 records, 0.55 after 0.60 is noise (HIGGS's sample: 0.53 for the majority class):

        >>> w = HeldoutWatch("accuracy", baseline=0.53, n=500)
        >>> [w.observe(b, {"accuracy": a}) for b, a in [(0, 0.60), (1, 0.55), (2, 0.55), (3, 0.54)]]
        [None, None, None, None]
    """

    metric: str
    baseline: float
    lower_is_better: bool = False
    min_gain: float = 0.05
    share: float = SHARE
    patience: int = PATIENCE
    loss_reference: float = math.inf
    n: int = 1_000_000
    z: float = Z
    best: float | None = None
    #: The batch of the best score: the checkpoint generation to go back to after a collapse.
    best_batch: int = -1
    low: int = 0

    @classmethod
    def for_labels(cls, y: np.ndarray, *, regression: bool) -> HeldoutWatch:
        """The watch for held-out labels ``y``: accuracy against the majority class, or
        RMSE against predicting the mean (learned: 10% under it).

        >>> HeldoutWatch.for_labels(np.array([0, 1, 1, 1]), regression=False).baseline
        0.75
        >>> round(HeldoutWatch.for_labels(np.array([1.0, 3.0]), regression=True).baseline, 3)
        1.0
        """
        if regression:
            spread = float(np.std(np.asarray(y, np.float64)))
            return cls(
                "rmse",
                baseline=spread,
                lower_is_better=True,
                min_gain=0.1 * spread,
                loss_reference=max(spread**2, 1e-12),
                n=len(y),
            )
        counts = np.bincount(np.asarray(y, np.int64))
        return cls(
            "accuracy",
            baseline=float(counts.max() / max(1, counts.sum())),
            loss_reference=math.log(max(2, len(counts))),
            n=len(y),
        )

    @property
    def loss_bound(self) -> float:
        """The prequential loss past which the model blew up.

        >>> round(HeldoutWatch.for_labels(np.array([0, 1]), regression=False).loss_bound)
        6931
        """
        return LOSS_FACTOR * self.loss_reference

    def gain(self, score: float) -> float:
        return self.baseline - score if self.lower_is_better else score - self.baseline

    def error(self, score: float) -> float:
        """The score's standard error on :attr:`n` records: a proportion's for accuracy, and
        for an RMSE its relative error ``1 / sqrt(2 n)`` (the mean of squared Gaussian errors).

        >>> round(HeldoutWatch("accuracy", baseline=0.5, n=500).error(0.6), 4)
        0.0219
        """
        n = max(1, self.n)
        if self.lower_is_better:
            return abs(score) / math.sqrt(2 * n)
        p = min(max(score, 0.0), 1.0)
        return math.sqrt(
            max(p * (1 - p), 0.25 / n) / n
        )  # never 0: a perfect score on few records is still a sample

    def _low_gain(self, score: float) -> float:
        """The gain of ``score``'s pessimistic bound (its lower one, for a score to maximise)."""
        return self.gain(score) - self.z * self.error(score)

    def _high_gain(self, score: float) -> float:
        return self.gain(score) + self.z * self.error(score)

    def observe(self, batch_id: int, scores: dict[str, float]) -> str | None:
        """Take the held-out scores of ``batch_id``: None while the model is sound, else what
        collapsed, in words."""
        if self.metric not in scores:
            return None
        score = float(scores[self.metric])
        if self.best is None or self.gain(score) > self.gain(self.best):
            self.best, self.best_batch = score, batch_id
        learned = self._low_gain(self.best)  # what the model surely learned, at its best
        if learned < self.min_gain or self._high_gain(score) > self.share * learned:
            self.low = 0
            return None
        self.low += 1
        if self.low < self.patience:
            return None
        trivial = (
            "predicting the mean scores" if self.lower_is_better else "the majority class scores"
        )
        return (
            f"held-out {self.metric} {score:.4f} after {self.best:.4f} at batch {self.best_batch} "
            f"({trivial} {self.baseline:.4f})"
        )

    def state(self) -> dict[str, Any]:
        """What a resumed run needs to go on watching (kept in the checkpoint)."""
        return {"best": self.best, "best_batch": self.best_batch}

    def restore(self, saved: dict[str, Any] | None) -> None:
        if saved:
            self.best, self.best_batch = saved.get("best"), int(saved.get("best_batch", -1))
