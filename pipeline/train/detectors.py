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


class _Gate:
    """When a signal may fire: after ``warmup`` records, and ``cooldown`` records after it last did."""

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
    """River's Page-Hinkley and ADWIN over the mini-batches' prequential losses; fires on a rise only.

    Page-Hinkley (``mode="up"``) reads each loss relative to a slow moving average of the
    loss (half-life ``halflife`` records), so one threshold serves any loss's scale: it sums
    how far each ratio passes 1 + ``ph_delta`` and fires past ``ph_threshold``, a few
    hundred records into an abrupt change. ADWIN reads the losses themselves and cuts its
    window where the halves' means differ beyond a Hoeffding bound: it finds slow, long
    changes; it reads each mini-batch's error rate where there is one (else its loss), and a
    cut counts only when the recent mean passed the window's by ``min_rise`` of it and by
    0.02 (a model learning makes both fall, and a fall is no alarm).

    Args:
        delta: ADWIN's confidence (smaller: fewer, later alarms).
        min_rise: ADWIN's recent mean must pass the window's by this share of it.
        ph_delta, ph_threshold: Page-Hinkley's tolerance and threshold, on the ratio.
        halflife: records over which the reference loss forgets half its past.
        warmup, cooldown: records before it may fire, and after it fired.

    Example:
        >>> rng = np.random.default_rng(0)
        >>> d = LossDrift(warmup=2_000)
        >>> [d.update(rng.normal(0.3, 0.05, 20).tolist(), size=64) for _ in range(100)].count(None)
        100
        >>> fired = [d.update(rng.normal(2.0, 0.2, 20).tolist(), size=64) for _ in range(10)]
        >>> fired[0] is not None and fired[0][0] > 1.5
        True
    """

    def __init__(self, *, delta: float = 0.002, min_rise: float = 0.3, ph_delta: float = 0.5,
                 ph_threshold: float = 15.0, halflife: int = 5_000, warmup: int = 10_000,
                 cooldown: int = 10_000) -> None:
        from river import drift

        self._adwin_new = lambda: drift.ADWIN(delta=delta)
        # alpha=1: the test's mean is over everything since its last reset (the ratio is
        # already relative to a moving reference).
        self._ph_new = lambda: drift.PageHinkley(min_instances=30, delta=ph_delta, threshold=ph_threshold,
                                                 alpha=1.0, mode="up")
        self._adwin, self._ph = self._adwin_new(), self._ph_new()
        self.min_rise, self.halflife = min_rise, halflife
        #: An ADWIN rise must also be this large in absolute terms (an error of 1% going to
        #: 1.4% is no drift worth a page).
        self.min_step = 0.02
        self.reference: float | None = None
        self.gate = _Gate(warmup, cooldown)

    def update(self, losses: Sequence[float], *, size: int,
               errors: Sequence[float] | None = None) -> tuple[float, str] | None:
        """Feed one task's mini-batch losses (of about ``size`` records each), in order, and
        their error rates (1 - accuracy; None: a numeric target, ADWIN reads the losses);
        return ``(rise, detail)`` when the loss or the error rose beyond chance, else None."""
        found = None
        forget = 1 - 0.5 ** (max(1, size) / self.halflife)
        errs = list(errors) if errors is not None and len(errors) == len(losses) else None
        for i, loss in enumerate(losses):
            if not math.isfinite(loss):
                continue
            # ADWIN reads the error rate where there is one: bounded in [0, 1], its home, and
            # a sharper signal than the loss of a model that is unsure anyway.
            value = errs[i] if errs is not None and math.isfinite(errs[i]) else loss
            what = "prequential error" if errs is not None else "prequential loss"
            reference = loss if self.reference is None else self.reference
            before = self._adwin.estimation
            self._adwin.update(value)
            self._ph.update(loss / max(reference, 1e-6))
            self.gate.seen += size
            after = self._adwin.estimation
            rose = (self._adwin.drift_detected and after > before * (1 + self.min_rise)
                    and after - before > self.min_step)
            if found is None and self.gate.open and (self._ph.drift_detected or rose):
                found = ((after / max(before, 1e-12), f"{what} {before:.4g} -> {after:.4g}") if rose else
                         (loss / max(reference, 1e-6), f"prequential loss {reference:.4g} -> {loss:.4g}"))
                self.gate.fired()
                self._adwin, self._ph = self._adwin_new(), self._ph_new()  # the past is another concept
            self.reference = reference + forget * (loss - reference)
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

    def __init__(self, *, threshold: float = 0.1, window: int = 2_000, warmup: int = 10_000,
                 cooldown: int = 10_000) -> None:
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
        self._counts = counts if self._counts is None or self._counts.shape != counts.shape else self._counts + counts
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

    def __init__(self, columns: Sequence[str], *, threshold: float = 0.2, window: int = 1_000,
                 warmup: int = 10_000, cooldown: int = 10_000, bins: int = 10) -> None:
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
        return np.bincount(np.searchsorted(self._edges[i], values, side="right"), minlength=len(self._edges[i]) + 1)
