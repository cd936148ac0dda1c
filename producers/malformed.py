"""A replay's malformed rows, as it meets them: counted in the producer metrics by reason,
handed to whoever listens (a run shows them beside the stream's rejects), checked against
``--max-malformed``, and written into the replay's report at the end."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.errors import ConfigError, DataError
from pipeline.observe import metrics
from producers.datasets import Dataset
from producers.datasets.base import MALFORMED_REASONS
from producers.report import MalformedSoFar, ReplayReport, malformed_detail


class MalformedRows:
    """Watches the rows ``dataset`` sets aside while a replay reads it.

    Args:
        dataset: the dataset the replay reads (it counts its malformed rows itself).
        meters: the producer metrics to count in.
        max_malformed: fail (:class:`~pipeline.errors.DataError`) once more rows than this
            are malformed: a count (>= 1), or a fraction of the rows read (< 1, checked
            from 1,000 rows on and at the end of the data). None: never.
        on_malformed: called with a :class:`~producers.report.MalformedSoFar` after each
            chunk that set rows aside.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        meters: metrics.ProducerMetrics,
        max_malformed: float | None,
        on_malformed: Callable[[MalformedSoFar], None] | None,
    ) -> None:
        if max_malformed is not None and max_malformed < 0:
            raise ConfigError(
                "Expected --max-malformed >= 0 (a count, or a fraction below 1). Received: "
                f"{max_malformed}"
            )
        self.dataset, self.metrics = dataset, meters
        self.max_malformed = max_malformed
        self.on_malformed = on_malformed
        # Series exist at 0 from the start, so a first malformed row is a rate, not a new series.
        for reason in MALFORMED_REASONS:
            self.metrics.malformed_rows.labels(self.dataset.name, reason)
        self._counted: dict[str, int] = {}

    def count(self) -> None:
        """Count the rows set aside since the last call, and tell ``on_malformed``."""
        data, news = self.dataset, False
        for reason, n in data.malformed_by_reason.items():
            new = n - self._counted.get(reason, 0)
            if new:
                news = True
                self.metrics.malformed_rows.labels(data.name, reason).inc(new)
                self._counted[reason] = n
        if news and self.on_malformed is not None:
            self.on_malformed(
                MalformedSoFar(
                    data.rows_read,
                    data.malformed,
                    dict(data.malformed_by_reason),
                    list(data.malformed_examples),
                )
            )

    def check(self, *, final: bool) -> None:
        """Fail once the malformed rows pass ``max_malformed``."""
        limit, data = self.max_malformed, self.dataset
        if limit is None or not data.malformed:
            return
        if limit >= 1:
            failed, allowed = data.malformed > limit, f"{limit:g} rows"
        else:
            failed = (final or data.rows_read >= 1000) and data.malformed > limit * max(
                1, data.rows_read
            )
            allowed = f"{limit:.0%} of the rows"
        if failed:
            detail = malformed_detail(data.malformed, data.malformed_examples)
            raise DataError(
                f"Expected at most {allowed} of {data.name} to be malformed (--max-malformed). "
                f"Received: {data.malformed} of {data.rows_read} rows read{detail}. Fix the file, "
                "or raise --max-malformed."
            )

    def finish(self, report: ReplayReport) -> None:
        """Write the rows set aside into ``report``, and count the last of them."""
        data = self.dataset
        report.malformed, report.malformed_by_reason = (
            data.malformed,
            dict(data.malformed_by_reason),
        )
        report.malformed_examples = list(data.malformed_examples)
        self.count()
