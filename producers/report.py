"""What a replay did: :class:`ReplayReport`, handed back as data (to the CLI, and from the
run's replay process to the run)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class ReplayReport:
    """What a replay did. ``records_sent`` counts acknowledged records only."""

    topic: str
    records_sent: int = 0
    bytes_sent: int = 0
    send_errors: int = 0
    malformed: int = 0
    malformed_by_reason: dict[str, int] = dataclasses.field(default_factory=dict)
    malformed_examples: list[tuple[int, str]] = dataclasses.field(
        default_factory=list
    )  # (line, reason)
    epochs: int = 0
    seconds: float = 0.0
    interrupted: bool = False
    resumed_after: int = 0  # records of this replay already in the topic, not sent again

    @property
    def records_per_s(self) -> float:
        return self.records_sent / self.seconds if self.seconds else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes_sent / self.seconds / 1e6 if self.seconds else 0.0

    def summary(self) -> str:
        """One line for people.

        >>> ReplayReport(
        ...     "t", records_sent=10, bytes_sent=8000, seconds=2.0
        ... ).summary()  # doctest: +NORMALIZE_WHITESPACE
        'sent 10 records (0.0 MB) to t in 2.0 s: 5 records/s, 0.00 MB/s; 0 send errors, 0 malformed
        rows skipped'
        >>> ReplayReport(
        ...     "t", malformed=2, malformed_examples=[(3, "not_a_number"), (9, "bad_label")]
        ... ).summary().split("; ")[1]
        '0 send errors, 2 malformed rows skipped (line 3: not_a_number, line 9: bad_label)'
        """
        stopped = " (interrupted)" if self.interrupted else ""
        if self.resumed_after:
            stopped += f" (resumed after the {self.resumed_after} records already there)"
        return (
            f"sent {self.records_sent} records ({self.bytes_sent / 1e6:.1f} MB) to {self.topic} "
            f"in {self.seconds:.1f} s{stopped}: {self.records_per_s:.0f} records/s, "
            f"{self.mb_per_s:.2f} MB/s; {self.send_errors} send errors, {self.malformed} "
            f"malformed rows skipped{self.malformed_detail()}"
        )

    def malformed_detail(self) -> str:
        """`` (line 3: not_a_number, ...)`` for the first malformed rows, or nothing."""
        return malformed_detail(self.malformed, self.malformed_examples)


@dataclasses.dataclass(frozen=True)
class MalformedSoFar:
    """The rows a replay has set aside so far, handed to the run as it goes (the run shows
    them beside the stream's rejects, and stops past ``--max-rejected``)."""

    rows_read: int
    malformed: int
    by_reason: dict[str, int]
    examples: list[tuple[int, str]]


def malformed_detail(malformed: int, examples: list[tuple[int, str]]) -> str:
    """The first malformed rows by line and reason, for a summary or an error.

    >>> malformed_detail(3, [(3, "not_a_number")])
    ' (line 3: not_a_number, ...)'
    """
    if not examples:
        return ""
    more = ", ..." if malformed > len(examples) else ""
    return " (" + ", ".join(f"line {n}: {why}" for n, why in examples) + more + ")"
