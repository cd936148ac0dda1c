"""Drift: when the stream changes, the run says so.

Three signals, each measured on the driver from what the executors send back with every
task, in stream order:

- ``loss``: River's ADWIN over each mini-batch's prequential error rate (its loss for a
  numeric target; scored before it trains), and a z-test of each task's error rate: a rise
  beyond chance, slow or sharp
  (:class:`~pipeline.train.detectors.LossDrift`; a
  model learning makes the loss fall, and a fall is no alarm).
- ``prior``: the class counts of a window of ``window`` records against a reference window,
  by the population stability index (PSI).
- ``feature``: for tables, each column of a sample of the records against a reference
  sample, by PSI over the reference's deciles; the column that moved most is named.

No signal fires in the first ``warmup`` records (the model is still learning, and the
reference is being drawn), nor for ``cooldown`` records after it fired (the model is
relearning). What each means and how to tune it: ``docs/drift.md``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.errors import ConfigError
from pipeline.train.detectors import CountsDrift, FeatureDrift, LossDrift

#: The signals, as ``streamtrain_drift_detected_total``'s ``signal`` label has them.
SIGNALS = ("loss", "prior", "feature")

#: Rows of features and labels each task sends back for the feature signal and the
#: held-out window after a drift, at most.
SAMPLE_ROWS = 256


@dataclasses.dataclass
class Drift:
    """One drift found.

    Attributes:
        signal: one of :data:`SIGNALS`.
        batch_id: the micro-batch whose records showed it.
        records: records of the stream before that batch (its position in the stream).
        statistic: the loss's rise (recent mean over the window's), or the PSI.
        detail: what moved, in words.
        offsets: per ``topic:partition``, the batch's ``[start, end)`` offsets.
        at: Unix time when it was found.
        generation: the checkpoint generation from just before it (kept; -1: none).
        reaction: what the run did (``--on-drift``'s mode, and with ``adapt`` the raise, the
            passes, and the replay of the batch: its passes, records and seconds).
    """

    signal: str
    batch_id: int
    records: int
    statistic: float
    detail: str
    offsets: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    at: float = 0.0
    generation: int = -1
    reaction: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Drift:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})

    def line(self) -> str:
        """The status line printed when it is found.

        >>> Drift("loss", 7, 60_000, 8.5, "prequential loss 0.1 -> 0.85").line()
        'drift at batch 7 (record 60,000): loss, prequential loss 0.1 -> 0.85 (statistic 8.5)'
        """
        return (
            f"drift at batch {self.batch_id} (record {self.records:,}): {self.signal}, "
            f"{self.detail} (statistic {self.statistic:.3g})"
        )


@dataclasses.dataclass
class DriftSettings:
    """The detectors' settings, and ``--on-drift adapt``'s (``--drift KEY=VALUE,...``); see
    ``docs/drift.md``."""

    warmup: int = 10_000
    cooldown: int = 10_000
    loss_delta: float = 0.002
    loss_min_rise: float = 0.3
    loss_z: float = 6.0
    prior_threshold: float = 0.1
    prior_window: int = 2_000
    feature_threshold: float = 0.2
    feature_window: int = 1_000
    adapt_lr_scale: float = 5.0
    adapt_records: int = 5_000
    adapt_passes: int = 4
    adapt_replay: int = 8

    @classmethod
    def parse(cls, text: str | None) -> DriftSettings:
        """Settings from ``--drift KEY=VALUE,...``; one bad pair raises a one-line error.
        Each value is positive, but for ``adapt_replay=0`` (no replay).

        >>> DriftSettings.parse("warmup=5000, loss_delta=0.001").warmup
        5000
        >>> DriftSettings.parse("adapt_replay=0").adapt_replay
        0
        >>> DriftSettings.parse("warmpu=1")  # doctest: +ELLIPSIS, +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        pipeline.errors.ConfigError: Expected --drift KEY=VALUE pairs, KEY one of adapt_lr_scale,
        ...
        """
        out: dict[str, Any] = {}
        fields = {f.name: f.type for f in dataclasses.fields(cls)}
        for pair in filter(None, (p.strip() for p in (text or "").split(","))):
            key, _, value = pair.partition("=")
            key = key.strip()
            try:
                number = (int if fields.get(key) == "int" else float)(value)
            except ValueError:
                number = -1
            if key not in fields or not (number > 0 or (key == "adapt_replay" and number == 0)):
                raise ConfigError(
                    f"Expected --drift KEY=VALUE pairs, KEY one of {', '.join(sorted(fields))}, "
                    f"VALUE a positive number (adapt_replay may be 0). Received: {pair!r}. "
                    "See docs/drift.md."
                )
            out[key] = number
        return cls(**out)


class DriftWatch:
    """The three signals over a run's batches, and the drifts found so far.

    Args:
        classes: the label's classes (0: a numeric target, no prior signal).
        columns: a table's column names (None: not a table, no feature signal).
        settings: the detectors' settings.
        found: drifts a resumed run found before (its detectors start afresh, with a warm-up).
    """

    def __init__(
        self,
        *,
        classes: int,
        columns: Sequence[str] | None,
        settings: DriftSettings | None = None,
        found: Sequence[dict[str, Any]] = (),
    ) -> None:
        s = self.settings = settings or DriftSettings()
        self.classes = classes
        self.loss = LossDrift(
            delta=s.loss_delta,
            min_rise=s.loss_min_rise,
            warmup=s.warmup,
            cooldown=s.cooldown,
            z=s.loss_z,
        )
        self.prior = (
            CountsDrift(
                threshold=s.prior_threshold,
                window=s.prior_window,
                warmup=s.warmup,
                cooldown=s.cooldown,
            )
            if classes > 1
            else None
        )
        self.feature = (
            FeatureDrift(
                columns,
                threshold=s.feature_threshold,
                window=s.feature_window,
                warmup=s.warmup,
                cooldown=s.cooldown,
            )
            if columns
            else None
        )
        self.found = [Drift.from_dict(d) for d in found]
        self.records = 0

    def observe(
        self,
        batch_id: int,
        results: Sequence[Any],
        offsets: dict[str, list[int]],
        *,
        batch_size: int,
    ) -> list[Drift]:
        """Feed one batch's task results (ordered by topic and partition: stream order
        within each partition); return the drifts it showed (at most one per signal)."""
        records_before = self.records
        out: dict[str, Drift] = {}

        def found(signal: str, statistic: float, detail: str) -> None:
            out.setdefault(
                signal,
                Drift(
                    signal,
                    batch_id,
                    records_before,
                    round(statistic, 4),
                    detail,
                    offsets,
                    round(time.time(), 3),
                ),
            )

        labels = np.zeros(max(self.classes, 1), np.int64)
        for r in results:
            hit = self.loss.update(
                getattr(r, "preq_losses", ()),
                size=batch_size,
                errors=getattr(r, "preq_errors", None),
            )
            if hit is not None:
                found("loss", *hit)
            counts = getattr(r, "label_counts", None)
            if counts is not None and len(counts) == len(labels):
                labels += np.asarray(counts, np.int64)
            sample = getattr(r, "sample_x", None)
            if self.feature is not None and sample is not None and len(sample):
                feat = self.feature.update(sample, records=r.records)
                if feat is not None:
                    found("feature", feat[0], f"column {feat[1]} PSI {feat[0]:.3f}")
            self.records += r.records
        if self.prior is not None and labels.sum():
            prior = self.prior.update(labels)
            if prior is not None:
                found("prior", prior[0], f"class prior PSI {prior[0]:.3f}")
        drifts = [out[s] for s in SIGNALS if s in out]
        self.found += drifts
        return drifts

    def state(self) -> list[dict[str, Any]]:
        """What a checkpoint keeps: the drifts found (the detectors' windows start afresh)."""
        return [d.to_dict() for d in self.found]


def offsets_of(ranges: Sequence[Any]) -> dict[str, list[int]]:
    """A batch's ranges as ``{"topic:partition": [start, end)}``, merged per partition."""
    out: dict[str, list[int]] = {}
    for r in ranges:
        key = f"{r.topic}:{r.partition}"
        lo, hi = out.get(key, [r.start, r.end])
        out[key] = [min(lo, r.start), max(hi, r.end)]
    return out
