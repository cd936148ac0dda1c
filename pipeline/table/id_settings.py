"""The settings of an ``id`` feature in the schema file, checked (each mistake one line) and
written back (:mod:`pipeline.table.schema` holds the feature).

Example:
    >>> from pipeline.table.schema import Feature
    >>> id_dict(Feature("item", "id", dim=8, ttl=1000))
    {'dim': 8, 'min_count': 1, 'ttl': 1000}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

#: An ID table's default Adagrad step. Each row learns from the sum of its records'
#: gradients (pipeline.train.id_rows); on bench/embeddings.py's click stream 0.05 reached an
#: AUC of 0.732, 0.15 0.744 and 0.5 0.745.
ROW_LEARNING_RATE = 0.1
#: How an ID table's rows learn on the parameter server (each row its own state).
ROW_OPTIMIZERS = ("adagrad", "sgd")
#: What features that share a table must agree on.
SHARED_SETTINGS = ("dim", "min_count", "ttl", "optimizer", "learning_rate")


def check_id(f: Any, fail: Callable[[str, Any], Exception]) -> None:
    """Raise ``fail(expected, received)`` for a wrong setting of ID feature ``f`` (or an ID
    setting on a feature of another kind)."""
    if f.kind != "id":
        raise fail("dim and table only on a feature of kind id", f.kind)
    if not isinstance(f.dim, int) or not 1 <= f.dim <= 1024:
        raise fail("dim, the embedding's size, a whole number in 1..1024", f.dim)
    if not isinstance(f.min_count, int) or f.min_count < 1:
        raise fail("min_count >= 1", f.min_count)
    if f.ttl is not None and (not isinstance(f.ttl, int) or f.ttl < 1):
        raise fail("ttl, records, >= 1 (or none)", f.ttl)
    if f.optimizer not in ROW_OPTIMIZERS:
        raise fail(f"optimizer in {ROW_OPTIMIZERS}", f.optimizer)
    if not f.learning_rate > 0:
        raise fail("learning_rate > 0", f.learning_rate)


def check_tables(ids: Sequence[Any], fail: Callable[[str, str, Any], Exception]) -> None:
    """Raise ``fail(where, expected, received)`` where two ID features name one table with
    different settings."""
    shapes: dict[str, tuple[Any, ...]] = {}
    for f in ids:
        shape = tuple(getattr(f, k) for k in SHARED_SETTINGS)
        if shapes.setdefault(f.table or f.name, shape) != shape:
            raise fail(
                f"feature {f.name!r}",
                f"the settings of the other features in table {f.table!r} "
                f"({', '.join(SHARED_SETTINGS)})",
                dict(zip(SHARED_SETTINGS, shape, strict=True)),
            )


def id_dict(f: Any) -> dict[str, Any]:
    """An ID feature's settings as the schema file holds them (defaults left out)."""
    d: dict[str, Any] = {"dim": f.dim, "min_count": f.min_count, "ttl": f.ttl}
    if f.table:
        d["table"] = f.table
    if (f.optimizer, f.learning_rate) != ("adagrad", ROW_LEARNING_RATE):
        d.update(optimizer=f.optimizer, learning_rate=f.learning_rate)
    return d
