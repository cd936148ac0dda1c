"""What every dataset reader yields: chunks of (ids, features, labels) for one split."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterator, Sequence
from typing import ClassVar

import numpy as np

from pipeline import codec
from pipeline.errors import ConfigError

SPLITS = ("train", "test")
#: Why a row is malformed: a line with too few or too many fields, a field that is not a
#: number, a feature that is NaN or infinite, a label outside the classes.
MALFORMED_REASONS = ("wrong_field_count", "not_a_number", "non_finite", "bad_label")


@dataclasses.dataclass
class Chunk:
    """Consecutive records of one split.

    Attributes:
        ids: record ids (uint64), unique within the split.
        x: features, ``(n, n_features)`` in the schema's wire dtype.
        y: class labels (int32), or a table's numeric targets (float32).
        values: the records as they go to Kafka, where the dataset writes them itself
            (a user's table, in its own format); None: encoded from ``x`` and ``y``.
    """

    ids: np.ndarray
    x: np.ndarray
    y: np.ndarray
    values: list[bytes] | None = None

    def __len__(self) -> int:
        return len(self.y)


class Dataset(abc.ABC):
    """A dataset reader: streams a split in chunks, counting rows it cannot use.

    Subclasses implement :meth:`iter_chunks` and set :attr:`schema`. Rows that
    cannot be parsed or encoded are skipped and counted (:meth:`reject`): in
    :attr:`malformed`, by reason in :attr:`malformed_by_reason`, and the first few
    with their line (or row) in :attr:`malformed_examples`.
    """

    #: How many rejected rows are kept as examples.
    EXAMPLES: ClassVar[int] = 5

    name: str
    schema: codec.Schema
    #: Built in: read from the data folder (no PATH), with a default model to train.
    builtin: ClassVar[bool] = False
    #: The reader options ``streamtrain produce`` passes on (``--label-column`` ...).
    options: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self.malformed = 0
        self.rows_read = 0  # good and bad
        self.malformed_by_reason: dict[str, int] = {}
        self.malformed_examples: list[tuple[int, str]] = []

    def reject(self, rejected: Sequence[tuple[int, str]]) -> None:
        """Count rows as malformed: ``(line, reason)`` each, lines being file lines (or row
        numbers)."""
        for line, reason in rejected:
            self.malformed += 1
            self.malformed_by_reason[reason] = self.malformed_by_reason.get(reason, 0) + 1
            if len(self.malformed_examples) < self.EXAMPLES:
                self.malformed_examples.append((int(line), reason))

    def check_rows(
        self,
        lines: np.ndarray,
        ok: np.ndarray,
        reasons: list[tuple[np.ndarray, str]],
        unparsed: Sequence[tuple[int, str]] = (),
    ) -> None:
        """Count a block: ``lines`` of its parsed rows, ``ok`` those kept, for each reason the
        mask of rows it rejects (the first that applies counts), and ``unparsed`` lines."""
        self.rows_read += len(lines) + len(unparsed)
        rejected = list(unparsed)
        left = ~ok
        for mask, reason in reasons:
            hit = left & mask
            rejected += [(int(line), reason) for line in lines[hit]]
            left &= ~hit
        self.reject(sorted(rejected))

    @abc.abstractmethod
    def iter_chunks(self, split: str = "train", *, chunk_rows: int = 4096) -> Iterator[Chunk]:
        """Yield the split's records in order, ``chunk_rows`` at a time (the last may be
        shorter)."""

    def num_rows(self, split: str = "train") -> int | None:
        """Rows in the split when known without reading it all, else None."""
        return None

    def load(self, split: str = "train") -> Chunk:
        """The whole split in memory (for evaluation sets and small data)."""
        chunks = list(self.iter_chunks(split, chunk_rows=65536))
        if not chunks:
            empty_x = np.empty((0, self.schema.n_features), self.schema.dtype)
            return Chunk(np.empty(0, np.uint64), empty_x, np.empty(0, np.int32))
        ids, x, y = (np.concatenate([getattr(c, f) for c in chunks]) for f in ("ids", "x", "y"))
        return Chunk(ids, x, y)


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ConfigError(f"Expected a split in {SPLITS}. Received: split={split!r}")
    return split


def chunk_arrays(
    x: np.ndarray, y: np.ndarray, chunk_rows: int, *, first_id: int = 0
) -> Iterator[Chunk]:
    """Cut in-memory arrays into chunks with consecutive ids."""
    for start in range(0, len(y), chunk_rows):
        stop = min(start + chunk_rows, len(y))
        yield Chunk(
            np.arange(first_id + start, first_id + stop, dtype=np.uint64),
            x[start:stop],
            y[start:stop],
        )
