"""What a run set aside: the records the stream rejected and the rows its replay could not
send, counted together by reason, shown as they happen and checked against
``--max-rejected``.

Example:
    >>> r = Rejects(limit=0.1)
    >>> r.add_stream({"not_a_number:size": 30}, trained=60)
    >>> r.add_replay(
    ...     MalformedSoFar(10, 10, {"wrong_field_count:2": 10}, [(7, "wrong_field_count:2")])
    ... )
    {'wrong_field_count:2': 10}
    >>> r.total, r.seen, r.line()
    (40, 100, 'rejected 40 (40%: not_a_number:size 30, wrong_field_count:2 10)')
    >>> print(r.verdict(final=True))  # doctest: +NORMALIZE_WHITESPACE
    Expected at most 10% of the records rejected (--max-rejected 0.1). Received: 40 of 100
    (not_a_number:size 30, wrong_field_count:2 10; line 7: wrong_field_count:2). Fix the data or the
    schema, or raise --max-rejected.
"""

from __future__ import annotations

from collections import Counter

from pipeline.errors import DataError
from producers.report import MalformedSoFar

#: The share of records rejected past which a run stops, unless ``--max-rejected`` says otherwise.
REJECTED_SHARE = 0.1
#: Records seen before the share is checked (a few bad records first is no verdict); the
#: end of the data is checked whatever it holds.
CHECK_FROM = 1000
#: What to do about a reason whose fix is one word.
HINTS = {
    "confluent_framed": (
        'the records carry the Confluent wire format: add "wire": "confluent" to the schema file '
        "(or pass --schema-registry URL)"
    ),
    "not_confluent_avro": (
        'the records are plain Avro bodies: remove "wire": "confluent" from the schema file'
    ),
}


class Rejects:
    """The run's tally of records set aside.

    Args:
        limit: the share of records seen that may be rejected (``--max-rejected``).
    """

    def __init__(self, *, limit: float = REJECTED_SHARE) -> None:
        self.limit = limit
        self.stream: Counter[str] = Counter()  # rejected by the stream's decoder, by reason
        self.trained = 0  # records the stream accepted
        self.replay: MalformedSoFar | None = None  # the rows the replay set aside, its latest word

    def add_stream(self, rejects: dict[str, int], *, trained: int) -> None:
        """A batch's rejects and the records it accepted."""
        self.stream.update(rejects)
        self.trained += trained

    def add_replay(self, so_far: MalformedSoFar | None) -> dict[str, int]:
        """The replay's latest tally (cumulative); returns what is new in it, by reason."""
        if so_far is None:
            return {}
        before = self.replay.by_reason if self.replay is not None else {}
        self.replay = so_far
        return {
            k: n - before.get(k, 0) for k, n in so_far.by_reason.items() if n > before.get(k, 0)
        }

    def by_reason(self) -> dict[str, int]:
        """Every rejected record by reason, the most frequent first."""
        counts = Counter(self.stream)
        if self.replay is not None:
            counts.update(self.replay.by_reason)
        return dict(counts.most_common())

    @property
    def total(self) -> int:
        return sum(self.stream.values()) + (self.replay.malformed if self.replay is not None else 0)

    @property
    def seen(self) -> int:
        """Records judged so far: trained, or set aside."""
        return self.trained + self.total

    def _top(self, n: int = 3) -> str:
        items = list(self.by_reason().items())
        more = f", {len(items) - n} more reasons" if len(items) > n else ""
        return ", ".join(f"{k} {v:,}" for k, v in items[:n]) + more

    def line(self) -> str:
        """The status line's part ("" while nothing was rejected)."""
        if not self.total:
            return ""
        return f"rejected {self.total:,} ({self.total / max(1, self.seen):.0%}: {self._top()})"

    def verdict(self, *, final: bool) -> DataError | None:
        """The run's stop (one line) once the rejected share passes the limit, from
        :data:`CHECK_FROM` records on or at the end of the data; None while within it."""
        seen, total = self.seen, self.total
        if not total or (seen < CHECK_FROM and not final) or total <= self.limit * seen:
            return None
        examples = self.replay.examples[:3] if self.replay is not None else []
        shown = (
            "; " + ", ".join(f"line {line}: {why}" for line, why in examples) if examples else ""
        )
        hints = [HINTS[k] for k in self.by_reason() if k in HINTS]
        hint = f" Hint: {hints[0]}." if hints else ""
        return DataError(
            f"Expected at most {self.limit:.0%} of the records rejected (--max-rejected "
            f"{self.limit:g}). Received: {total:,} of {seen:,} ({self._top()}{shown}).{hint} Fix "
            "the data or the schema, or raise --max-rejected."
        )

    def to_dict(self) -> dict[str, object]:
        """What the report keeps: counts by reason, and the replay's first rows set aside."""
        return {
            "by_reason": self.by_reason(),
            "replay_rows": self.replay.malformed if self.replay else 0,
            "examples": [list(e) for e in self.replay.examples] if self.replay else [],
        }
