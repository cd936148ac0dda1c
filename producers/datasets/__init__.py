"""Dataset readers: each streams a split in chunks of (ids, features, labels).

Example:
    >>> from producers import datasets
    >>> sorted(datasets.NAMES)
    ['clicks', 'csv', 'fashion-mnist', 'higgs', 'jsonl', 'mnist', 'npz', 'parquet']
    >>> datasets.BUILTIN          # read from the data folder; what `streamtrain run` trains
    ('mnist', 'fashion-mnist', 'higgs')
    >>> datasets.options("csv")      # a user's table: CSV, JSON lines or Parquet, by a schema
    ('label', 'schema', 'holdout', 'format')
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from producers.datasets.base import SPLITS, Chunk, Dataset
from producers.datasets.click_stream import ClickStream
from producers.datasets.fashion import FashionMnist
from producers.datasets.higgs import Higgs
from producers.datasets.mnist import Mnist
from producers.datasets.table import Table
from producers.datasets.tabular import Npz

_REGISTRY: dict[str, type[Dataset]] = {
    "mnist": Mnist,
    "fashion-mnist": FashionMnist,
    "higgs": Higgs,
    "csv": Table,
    "jsonl": Table,
    "parquet": Table,
    "npz": Npz,
    "clicks": ClickStream,  # generated: no file, no end (--limit bounds it)
}
#: Every dataset's name, and those built in (no PATH: read from the data folder).
NAMES = tuple(_REGISTRY)
BUILTIN = tuple(name for name, cls in _REGISTRY.items() if cls.builtin)


def options(name: str) -> tuple[str, ...]:
    """The reader options dataset ``name`` takes."""
    return _REGISTRY[name].options


def get(name: str | Dataset, path: str | Path | None = None, **options: Any) -> Dataset:
    """A dataset reader by name (``mnist``, ``fashion-mnist``, ``higgs``, ``csv``, ``npz``),
    or the instance itself."""
    if isinstance(name, Dataset):
        return name
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"Unknown dataset {name!r}; expected one of {list(NAMES)}.") from None
    if not cls.builtin and not getattr(cls, "generated", False) and path is None:
        raise ConfigError(f"The {name} dataset needs a PATH to the file.")
    return cls(path, **options)  # type: ignore[call-arg]


__all__ = [
    "BUILTIN",
    "NAMES",
    "SPLITS",
    "Chunk",
    "Dataset",
    "FashionMnist",
    "Higgs",
    "Mnist",
    "Npz",
    "Table",
    "get",
    "options",
]
