"""A click stream from a generative model streamtrain owns, so its best possible score is
computed, not guessed: the yardstick for learning IDs (users, items) from a stream.

Each record is a user seeing an item. Users and items are drawn from Zipf laws (popularity
exponent near 1, as real item and user popularity is) over ID spaces that keep renewing:
each popularity slot's ID is replaced by a new one from time to time, so new IDs keep
arriving and old ones stop being seen. Each ID has a hidden vector and a bias; the click's
probability is the logistic of the two vectors' dot product, the biases and a few dense
features' weighted sum.
The generator knows every record's true probability, so the Bayes-optimal logloss and AUC of
any stretch of the stream are computed from it (:meth:`ClickModel.best`).

Everything is a function of the record's index and the seed (counter-based hashing, no
state): any stretch of the stream is generated alone, the same at every replay.

Example:
    >>> model = ClickModel(users=10_000, items=5_000, seed=7)
    >>> clicks = model.sample(0, 4)
    >>> clicks.user_id.tolist() == model.sample(0, 4).user_id.tolist()   # a replay: the same
    True
    >>> clicks.x.shape, clicks.label.dtype.name
    ((4, 3), 'int8')
    >>> model.record(clicks, 0)  # doctest: +ELLIPSIS
    {'user_id': 'u...', 'item_id': 'i...', 'x0': ..., 'x1': ..., 'x2': ..., 'clicked': ...}
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from pipeline.errors import ConfigError

#: Streams of the counter-based hash, one per quantity drawn (a record's or an ID's).
_USER, _ITEM, _LABEL, _DENSE, _VECTOR, _BIAS = range(6)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: 64 well-mixed bits from each 64-bit input.

    >>> a, b = np.array([0, 1], dtype=np.uint64), np.array([1, 0], dtype=np.uint64)
    >>> _mix(a).tolist() != _mix(b).tolist()
    True
    """
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _uniform(seed: int, stream: int, keys: np.ndarray, lane: int = 0) -> np.ndarray:
    """Uniforms in (0, 1), one per key: a function of (seed, stream, key, lane) alone."""
    with np.errstate(over="ignore"):
        base = np.uint64(
            (seed * 0x9E3779B97F4A7C15 + stream * 0xD1B54A32D192ED03) & 0xFFFFFFFF_FFFFFFFF
        )
        z = _mix(keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + base + np.uint64(lane))
        z = _mix(z ^ np.uint64(lane * 0x632BE59BD9B4E019 & 0xFFFFFFFF_FFFFFFFF))
    return ((z >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


def _normal(seed: int, stream: int, keys: np.ndarray, lane: int = 0) -> np.ndarray:
    """Standard normals, one per key (Box-Muller on two of the hash's uniforms)."""
    u1 = _uniform(seed, stream, keys, 2 * lane)
    u2 = _uniform(seed, stream, keys, 2 * lane + 1)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def zipf_rank(u: np.ndarray, n: int, exponent: float) -> np.ndarray:
    """Ranks in ``1..n`` from uniforms, Zipf-distributed (the continuous law's inverse CDF).

    >>> r = zipf_rank(np.linspace(0.001, 0.999, 1000), 1_000_000, 1.0)
    >>> int(r.min()) >= 1 and int(r.max()) <= 1_000_000, float(np.median(r)) < 2_000
    (True, True)
    """
    top = float(n + 1)  # the continuous law over [1, n + 1): its floor takes every rank
    if abs(exponent - 1.0) < 1e-9:
        ranks = np.power(top, u)
    else:
        e = 1.0 - exponent
        ranks = np.power((top**e - 1.0) * u + 1.0, 1.0 / e)
    return np.clip(np.floor(ranks), 1, n).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class Clicks:
    """Records ``start .. start + len - 1`` of a click stream, with their true probability."""

    start: int
    user_id: np.ndarray  # int64 IDs
    item_id: np.ndarray
    x: np.ndarray  # (n, dense) float32
    label: np.ndarray  # int8: clicked or not
    p: np.ndarray  # float64: the click's true probability

    def __len__(self) -> int:
        return len(self.label)


@dataclasses.dataclass(frozen=True)
class ClickModel:
    """The click stream's generative model.

    Args:
        users: distinct users live at any moment (the ID space's width).
        items: distinct items live at any moment.
        exponent: Zipf exponent of popularity, for users and items.
        dim: size of the hidden vectors.
        dense: dense features per record.
        renewal: the share of each ID space that is replaced per million records (each
            slot's ID lives ``1e6 / renewal`` records).
        scale: the dot product's standard deviation (the IDs' share of the signal).
        base: the logit's intercept (sets the click rate).
        seed: everything else.
    """

    users: int = 1_000_000
    items: int = 200_000
    exponent: float = 1.0
    dim: int = 8
    dense: int = 3
    renewal: float = 0.2
    scale: float = 1.5
    base: float = -1.5
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("users", "items", "dim", "dense"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"Expected a positive integer for the click model's {name}. Received: "
                    f"{name}={getattr(self, name)}. Give 1 or more."
                )
        if not 0.0 <= self.renewal <= 1.0 or self.exponent <= 0:
            raise ConfigError(
                f"Expected renewal in [0, 1] and exponent > 0. Received: renewal={self.renewal}, "
                f"exponent={self.exponent}."
            )

    def _ids(self, stream: int, width: int, index: np.ndarray) -> np.ndarray:
        """IDs for records ``index``. A record draws a popularity slot (Zipf over ``width``);
        each slot's ID is replaced by a new one every ``1e6 / renewal`` records, at a phase of
        its own, so IDs keep arriving, live a while at their slot's popularity, and leave."""
        slot = zipf_rank(_uniform(self.seed, stream, index), width, self.exponent) - 1
        if self.renewal == 0:
            return slot
        lifetime = 1e6 / self.renewal
        phase = _uniform(self.seed, stream + 8, slot.astype(np.uint64)) * lifetime
        generation = np.floor((index + phase) / lifetime).astype(np.int64)
        return generation * width + slot

    def vectors(self, kind: str, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The hidden vectors ``(n, dim)`` and biases ``(n,)`` of ``kind``'s (user, item) IDs."""
        stream = {"user": 0, "item": 1}[kind]
        keys = ids.astype(np.uint64) * np.uint64(2) + np.uint64(stream)
        sigma = np.sqrt(self.scale / np.sqrt(self.dim))  # so that u.v has std `scale`
        vec = np.stack([_normal(self.seed, _VECTOR, keys, j) for j in range(self.dim)], axis=1)
        return vec * sigma, 0.5 * _normal(self.seed, _BIAS, keys)

    def weights(self) -> np.ndarray:
        """The dense features' weights."""
        return 0.5 * _normal(self.seed, _DENSE, np.arange(self.dense) + (1 << 40))

    def sample(self, start: int, n: int) -> Clicks:
        """Records ``start .. start + n - 1``."""
        index = np.arange(start, start + n, dtype=np.int64)
        users, items = self._ids(_USER, self.users, index), self._ids(_ITEM, self.items, index)
        u, bu = self.vectors("user", users)
        v, bi = self.vectors("item", items)
        keys = index.astype(np.uint64)
        x = np.stack([_normal(self.seed, _DENSE, keys, j) for j in range(self.dense)], axis=1)
        logit = self.base + (u * v).sum(axis=1) + bu + bi + x @ self.weights()
        p = 1.0 / (1.0 + np.exp(-logit))
        label = (_uniform(self.seed, _LABEL, keys) < p).astype(np.int8)
        return Clicks(start, users, items, x.astype(np.float32), label, p)

    def record(self, clicks: Clicks, i: int) -> dict[str, Any]:
        """Record ``i`` of ``clicks`` as it goes to Kafka: a JSON object of a user's table."""
        row: dict[str, Any] = {
            "user_id": f"u{clicks.user_id[i]}",
            "item_id": f"i{clicks.item_id[i]}",
        }
        row.update({f"x{j}": round(float(clicks.x[i, j]), 5) for j in range(self.dense)})
        row["clicked"] = int(clicks.label[i])
        return row

    def best(
        self, start: int, n: int, *, auc: Callable[[np.ndarray, np.ndarray], float] | None = None
    ) -> dict[str, float]:
        """The best any model can score on records ``start .. start + n - 1``: the true
        probabilities' logloss (and their AUC, by ``auc(labels, scores)`` where given),
        beside a constant's logloss and the click rate.

        >>> b = ClickModel(users=10_000, items=5_000).best(0, 20_000)
        >>> b["logloss"] < b["logloss_constant"], sorted(b)
        (True, ['click_rate', 'logloss', 'logloss_constant'])
        """
        c = self.sample(start, n)
        p = np.clip(c.p, 1e-12, 1 - 1e-12)
        y = c.label.astype(np.float64)
        rate = float(y.mean())
        constant = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate)) if 0 < rate < 1 else 0.0
        out = {
            "logloss": float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean()),
            "logloss_constant": float(constant),
            "click_rate": rate,
        }
        if auc is not None and 0 < rate < 1:  # an AUC needs both classes
            out["auc"] = auc(c.label, c.p)
        return out

    def settings(self) -> dict[str, Any]:
        """The generator's settings (printed with every figure measured on its stream)."""
        return dataclasses.asdict(self)

    def write_jsonl(
        self,
        path: str | Path,
        records: int,
        *,
        chunk: int = 100_000,
        auc: Callable[[np.ndarray, np.ndarray], float] | None = None,
    ) -> Path:
        """Records ``0 .. records - 1`` as JSON lines (a user's table), and beside the file
        ``<stem>.best.json``: the settings and the best score on the last tenth.

        >>> import tempfile
        >>> out = ClickModel(users=1_000, items=500).write_jsonl(
        ...     Path(tempfile.mkdtemp()) / "clicks.jsonl", 1_000)
        >>> len(out.read_text().splitlines()), sorted(json.loads(
        ...     out.with_name("clicks.best.json").read_text()))
        (1000, ['best_last_tenth', 'records', 'settings'])
        """
        path = Path(path)
        with open(path, "wb") as f:
            for start in range(0, records, chunk):
                clicks = self.sample(start, min(chunk, records - start))
                f.writelines(
                    orjson.dumps(self.record(clicks, i)) + b"\n" for i in range(len(clicks))
                )
        tenth = max(1, records // 10)
        best = {
            "records": records,
            "settings": self.settings(),
            "best_last_tenth": self.best(records - tenth, tenth, auc=auc),
        }
        path.with_name(f"{path.stem}.best.json").write_text(json.dumps(best, indent=2) + "\n")
        return path
