"""The drift detectors, each over one kind of figure the executors send back: the
prequential losses and error rates (:class:`LossDrift`), counts over fixed bins (the class
prior: :class:`CountsDrift`) and a sample of a table's rows (:class:`FeatureDrift`).
:mod:`pipeline.train.drift` runs them over a run's batches."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def psi(expected: np.ndarray, actual: np.ndarray, *, floor: float = 1e-4) -> float:
    """The population stability index of counts ``actual`` against ``expected`` (same bins).

    Empty bins are floored at ``floor`` of the mass, so one never seen is large, not infinite.

    Example:
        >>> psi(np.array([50, 50]), np.array([50, 50]))
        0.0
        >>> round(psi(np.array([50, 50]), np.array([90, 10])), 3)
        0.879
    """
    e = np.maximum(np.asarray(expected, np.float64) / max(1, np.sum(expected)), floor)
    a = np.maximum(np.asarray(actual, np.float64) / max(1, np.sum(actual)), floor)
    return float(np.sum((a - e) * np.log(a / e)))


#: The least records a sharp-rise z-test reads: a task of a few dozen records (tiny
#: micro-batches) has an error rate too noisy for it, and fired on a steady HIGGS run.
MIN_TEST_RECORDS = 500


class _Gate:
    """When a signal may fire: after ``warmup`` records, and ``cooldown`` records after it last
    did."""

    def __init__(self, warmup: int, cooldown: int) -> None:
        self.warmup, self.cooldown = warmup, cooldown
        self.seen = 0
        self._quiet_until = warmup

    @property
    def open(self) -> bool:
        return self.seen >= self._quiet_until

    def fired(self) -> None:
        self._quiet_until = self.seen + self.cooldown


class LossDrift:
    """The prequential loss and error rate: a rise beyond chance, slow or sharp.

    Two tests, both on a rise only (a model learning makes both fall, and a fall is no
    alarm). River's ADWIN reads each mini-batch's error rate (its loss for a numeric target)
    and cuts its window where its halves' means differ beyond a Hoeffding bound: it finds
    slow, long changes; a cut counts only when the recent mean passed the window's by
    ``min_rise`` of it and by 0.02. ADWIN's bound is distribution-free, so wide that it
    misses a sharp rise a model relearns within a few thousand records; a two-proportion
    z-test of each task's error rate against its moving level (half-life ``halflife``
    records) finds those (:meth:`_error_jump`). River's Page-Hinkley on the loss was tried
    and dropped: a mini-batch's loss is heavy-tailed (one confident mistake dominates it),
    and it fired on a stationary MNIST run.

    Args:
        delta: ADWIN's confidence (smaller: fewer, later alarms).
        min_rise: ADWIN's recent mean must pass the window's by this share of it.
        halflife: records over which the error's moving level forgets half its past.
        warmup, cooldown: records before it may fire, and after it fired.
        z: the z-score a task's error rate must reach over its moving level.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> d = LossDrift(warmup=2_000)
        >>> steady = [
        ...     d.update([0.2] * 16, size=64, errors=(rng.binomial(64, 0.05, 16) / 64).tolist())
        ...     for _ in range(100)
        ... ]
        >>> steady.count(None)
        100
        >>> d.update([1.0] * 16, size=64, errors=(rng.binomial(64, 0.4, 16) / 64).tolist())[1]
        'prequential error 0.05155 -> 0.4131'
    """

    def __init__(
        self,
        *,
        delta: float = 0.002,
        min_rise: float = 0.3,
        halflife: int = 5_000,
        warmup: int = 10_000,
        cooldown: int = 10_000,
        z: float = 6.0,
    ) -> None:
        from river import drift

        self._adwin_new = lambda: drift.ADWIN(delta=delta)
        self._adwin = self._adwin_new()
        self.min_rise, self.halflife, self.z = min_rise, halflife, z
        #: An ADWIN rise must also be this large in absolute terms (an error of 1% going to
        #: 1.4% is no drift worth a page).
        self.min_step = 0.02
        self.error: float | None = None  # the error rate's moving level, over tasks
        self._error_n = 0.0  # the records behind it (at most two half-lives' worth)
        self.gate = _Gate(warmup, cooldown)

    def update(
        self, losses: Sequence[float], *, size: int, errors: Sequence[float] | None = None
    ) -> tuple[float, str] | None:
        """Feed one task's mini-batch losses (of about ``size`` records each), in order, and
        their error rates (1 - accuracy; None: a numeric target, ADWIN reads the losses);
        return ``(rise, detail)`` when the error (or the loss) rose beyond chance, else None."""
        found = None
        errs = list(errors) if errors is not None and len(errors) == len(losses) else None
        what = "prequential error" if errs is not None else "prequential loss"
        for i, loss in enumerate(losses):
            value = errs[i] if errs is not None else loss
            if not math.isfinite(value):
                continue
            before = self._adwin.estimation
            self._adwin.update(value)
            self.gate.seen += size
            after = self._adwin.estimation
            rose = (
                self._adwin.drift_detected
                and after > before * (1 + self.min_rise)
                and after - before > self.min_step
            )
            if found is None and self.gate.open and rose:
                found = (after / max(before, 1e-12), f"{what} {before:.4g} -> {after:.4g}")
        if errs is not None:
            jump = self._error_jump([e for e in errs if math.isfinite(e)], size)
            found = found or jump
        if found is not None:
            self.gate.fired()
            self._adwin = self._adwin_new()  # the past is another concept
        return found

    def _error_jump(self, errs: list[float], size: int) -> tuple[float, str] | None:
        """A task's error rate against its moving level, by a two-proportion z-test: a short,
        sharp rise (a concept the model relearns in a couple of thousand records) that ADWIN's
        distribution-free bound is too wide to see. It must pass ``z``, the level by half, and
        3 points. Returns ``(rise, detail)`` when it fires; the level learns the task after."""
        if not errs:
            return None
        n, p = len(errs) * size, float(np.mean(errs))
        found = None
        # Below MIN_TEST_RECORDS a task's rate is too noisy to test (a run of tiny batches).
        if self.error is not None and self._error_n and self.gate.open and n >= MIN_TEST_RECORDS:
            pooled = (p * n + self.error * self._error_n) / (n + self._error_n)
            spread = math.sqrt(max(pooled * (1 - pooled), 1e-12) * (1 / n + 1 / self._error_n))
            if (
                (p - self.error) / spread >= self.z
                and p >= 1.5 * self.error
                and p - self.error >= 0.03
            ):
                found = (
                    p / max(self.error, 1e-6),
                    f"prequential error {self.error:.4g} -> {p:.4g}",
                )
        forget = 1 - 0.5 ** (n / self.halflife)
        self.error = p if self.error is None else self.error + forget * (p - self.error)
        self._error_n = min(self._error_n + n, 2 * self.halflife)
        return found


class CountsDrift:
    """PSI of a window's counts over fixed bins against a reference window's.

    The reference is the first full window after ``warmup``; after a drift, the window
    that showed it becomes the reference (the stream's new state).

    Example:
        >>> d = CountsDrift(window=1_000, warmup=0)
        >>> [d.update(np.array([500, 500])) for _ in range(5)]
        [None, None, None, None, None]
        >>> d.update(np.array([900, 100]))[0] > 0.5
        True
    """

    def __init__(
        self,
        *,
        threshold: float = 0.1,
        window: int = 2_000,
        warmup: int = 10_000,
        cooldown: int = 10_000,
    ) -> None:
        self.threshold, self.window = threshold, window
        self.gate = _Gate(warmup, cooldown)
        self.reference: np.ndarray | None = None
        self._counts: np.ndarray | None = None

    def update(self, counts: np.ndarray) -> tuple[float, np.ndarray] | None:
        """Add one batch's ``counts`` (per bin; a 2-D array: per column, per bin); return
        ``(psi, psi per column)`` when a full window moved past the threshold."""
        counts = np.atleast_2d(np.asarray(counts, np.float64))
        n = int(counts[0].sum())
        self.gate.seen += n
        if self.gate.seen <= self.gate.warmup:
            return None
        self._counts = (
            counts
            if self._counts is None or self._counts.shape != counts.shape
            else self._counts + counts
        )
        if self._counts[0].sum() < self.window:
            return None
        window, self._counts = self._counts, None
        if self.reference is None:
            self.reference = window
            return None
        per_column = np.array([psi(r, w) for r, w in zip(self.reference, window, strict=True)])
        if per_column.max() < self.threshold or not self.gate.open:
            return None
        self.reference = window
        self.gate.fired()
        return float(per_column.max()), per_column


class FeatureDrift:
    """Per column of a table, PSI of sampled rows over the reference sample's deciles.

    Args:
        columns: the columns' names.
        threshold, window, warmup, cooldown: see :class:`CountsDrift` (counted in sampled rows
            for ``window``, in records for the others).
    """

    def __init__(
        self,
        columns: Sequence[str],
        *,
        threshold: float = 0.2,
        window: int = 1_000,
        warmup: int = 10_000,
        cooldown: int = 10_000,
        bins: int = 10,
    ) -> None:
        self.columns, self.bins = list(columns), bins
        self.threshold, self.window = threshold, window
        self.gate = _Gate(warmup, cooldown)
        self._edges: list[np.ndarray] | None = None
        self._reference: list[np.ndarray] = []
        self._rows: list[np.ndarray] = []

    def update(self, rows: np.ndarray, *, records: int) -> tuple[float, str] | None:
        """Add a sample ``rows`` (one per record sampled) of ``records`` records; return
        ``(psi, column)`` when a full window's worst column moved past the threshold."""
        self.gate.seen += records
        if self.gate.seen <= self.gate.warmup or not len(rows):
            return None
        self._rows.append(np.asarray(rows, np.float64).reshape(len(rows), -1))
        if sum(len(r) for r in self._rows) < self.window:
            return None
        window, self._rows = np.concatenate(self._rows), []
        if self._edges is None:
            self._fit(window)
            return None
        scores = [psi(ref, self._hist(i, window[:, i])) for i, ref in enumerate(self._reference)]
        worst = int(np.argmax(scores))
        if scores[worst] < self.threshold or not self.gate.open:
            return None
        self._fit(window)
        self.gate.fired()
        name = self.columns[worst] if worst < len(self.columns) else f"x{worst}"
        return float(scores[worst]), name

    def _fit(self, window: np.ndarray) -> None:
        # Inner deciles as edges; a column of few values (a one-hot) gets one bin per value.
        qs = np.linspace(0, 1, self.bins + 1)[1:-1]
        self._edges = [np.unique(np.quantile(window[:, i], qs)) for i in range(window.shape[1])]
        self._reference = [self._hist(i, window[:, i]) for i in range(window.shape[1])]

    def _hist(self, i: int, values: np.ndarray) -> np.ndarray:
        assert self._edges is not None
        return np.bincount(
            np.searchsorted(self._edges[i], values, side="right"), minlength=len(self._edges[i]) + 1
        )
