"""``streamtrain produce clicks``: the click model's stream into a topic, as a recommender's
click log would arrive (JSON records of a user, an item, dense features and the click), with
the schema that trains it (:func:`click_schema`: the user and the item as ID features).

Example:
    >>> stream = ClickStream(model=ClickModel(users=1_000, items=500))
    >>> chunk = next(stream.iter_chunks(chunk_rows=3))
    >>> len(chunk), chunk.values[0][:12], stream.schema.input_shape
    (3, b'{"user_id":"', (35,))
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from pipeline import codec
from pipeline.table.schema import Feature, Label, TableSchema
from pipeline.table.transform import Encoder, Reasons
from pipeline.table.writers import encode_values
from producers.datasets.base import Chunk, Dataset, check_split
from producers.datasets.clicks import ClickModel

#: The rows' size the schema gives each ID (the model's own vectors have ``dim``).
ID_DIM = 16
#: Records after which an ID not seen again loses its row: a few lifetimes of the rarest
#: IDs that still matter, so that memory stays flat while IDs keep renewing.
ID_TTL = 500_000


def click_schema(model: ClickModel, *, dim: int = ID_DIM, ttl: int | None = ID_TTL) -> TableSchema:
    """The schema of the click stream: ``user_id`` and ``item_id`` as IDs, the dense features
    numeric, ``clicked`` the label.

    >>> [f.kind for f in click_schema(ClickModel(dense=2)).features]
    ['id', 'id', 'numeric', 'numeric']
    """
    return TableSchema(
        (
            Feature("user_id", "id", dim=dim, ttl=ttl),
            Feature("item_id", "id", dim=dim, ttl=ttl),
            *(Feature(f"x{j}") for j in range(model.dense)),
        ),
        Label("clicked", ("0", "1")),
    )


class ClickStream(Dataset):
    """The click model's records, from record 0 on, without end (``--limit`` bounds them)."""

    name = "clicks"
    generated = True  # no file: the stream is made here

    def __init__(self, path: Any = None, *, model: ClickModel | None = None) -> None:
        super().__init__()
        self.model = model or ClickModel()
        self.table = click_schema(self.model)
        self.schema = codec.table(self.name, self.table)

    def iter_chunks(self, split: str = "train", *, chunk_rows: int = 4096) -> Iterator[Chunk]:
        check_split(split)
        if split == "test":  # a stream has no held-out file: the run holds out by key
            return
        encoder = Encoder(self.table)
        start = 0
        while True:
            clicks = self.model.sample(start, chunk_rows)
            rows = [self.model.record(clicks, i) for i in range(len(clicks))]
            columns = {k: [r[k] for r in rows] for k in rows[0]}
            columns["clicked"] = [str(v) for v in columns["clicked"]]
            x, y, _ = encoder.encode(columns, len(rows), Reasons())
            ids = np.arange(start, start + len(rows), dtype=np.uint64)
            self.rows_read += len(rows)
            yield Chunk(ids, x, y, values=encode_values(rows, self.table))
            start += len(rows)

    def describe(self) -> dict[str, Any]:
        return {"generator": self.model.settings(), "schema": self.table.to_dict()}
