"""bench/drift.py's streams: their change points and lengths, and their records (MNIST and
Fashion-MNIST arrays, River's generators as JSON lines).

>>> [s.name for s in streams(1.0) if s.change is not None and not s.gradual][:3]
['mnist-permuted', 'sea-abrupt', 'agrawal-abrupt']
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

AFTER = 20_000  # records after a change over which accuracy is measured


@dataclasses.dataclass(frozen=True)
class Stream:
    """One benchmark stream: its kind, where it changes (None: stationary) and its length."""

    name: str
    kind: str  # mnist, table, higgs
    change: int | None
    length: int
    gradual: bool = False  # the change spreads over records: its delay is not an abrupt one's


def streams(scale: float) -> list[Stream]:
    """The streams at ``scale``."""

    def n(records: int) -> int:
        return max(500, int(records * scale))

    return [
        Stream("mnist-permuted", "mnist", n(60_000), n(60_000) + n(AFTER)),
        Stream("mnist-rotated", "mnist", n(20_000), n(20_000) + n(30_000), gradual=True),
        Stream("sea-abrupt", "table", n(20_000), n(20_000) + n(AFTER)),
        Stream("sea-gradual", "table", n(20_000), n(20_000) + n(AFTER), gradual=True),
        Stream("agrawal-abrupt", "table", n(20_000), n(20_000) + n(AFTER)),
        Stream("mnist-fashion", "mnist", n(60_000), n(60_000) + n(AFTER)),
        Stream("sea-flipped", "table", n(20_000), n(20_000) + n(AFTER)),
        Stream("agrawal-flipped", "table", n(20_000), n(20_000) + n(AFTER)),
        Stream("mnist-stationary", "mnist", None, n(300_000)),
        Stream("higgs-stationary", "higgs", None, n(100_000)),
    ]


# --- the data ---


def mnist_stream(stream: Stream, folder: Path, scale: float) -> Path:
    """A data folder whose ``mnist.npz`` training split is ``stream``'s records in order
    (the test split as it is: the concept before any change)."""
    from producers.datasets import mnist

    arrays = mnist.load_arrays()
    x, y = arrays["x_train"], arrays["y_train"]
    reps = math.ceil(stream.length / len(y))
    xs, ys = (
        np.concatenate([x] * reps)[: stream.length].copy(),
        np.concatenate([y] * reps)[: stream.length].copy(),
    )
    if stream.name == "mnist-permuted":
        # A fixed permutation with no fixed point: every class gets another's label.
        perm = np.roll(np.arange(10), 3)
        ys[stream.change :] = perm[ys[stream.change :]]
    elif stream.name == "mnist-fashion":
        from producers.datasets import _idx
        from producers.datasets.fashion import FashionMnist

        fx, fy = _idx.load_idx_split(FashionMnist().folder, "train")
        span = stream.length - (stream.change or 0)
        # The same pixels' layout and the same ten labels, now meaning clothes.
        xs[stream.change :] = fx[:span].reshape(xs[stream.change :].shape)
        ys[stream.change :] = fy[:span].astype(ys.dtype)
    elif stream.name == "mnist-rotated":
        from scipy import ndimage

        span = max(1, int(30_000 * scale))
        for i in range(stream.change or 0, stream.length):
            angle = 90.0 * min(1.0, (i - (stream.change or 0)) / span)
            xs[i] = np.clip(
                ndimage.rotate(xs[i].astype(np.float32), angle, reshape=False, order=1), 0, 255
            )
    out = folder / "data"
    out.mkdir(parents=True, exist_ok=True)
    np.savez(
        out / "mnist.npz", x_train=xs, y_train=ys, x_test=arrays["x_test"], y_test=arrays["y_test"]
    )
    return out


def table_rows(stream: Stream, *, seed: int = 7) -> Iterator[tuple[dict[str, float], int]]:
    """``stream``'s records from River's generators, in order."""
    from river.datasets import synth

    before, after = stream.change or 0, stream.length - (stream.change or 0)
    if stream.name.endswith("-flipped"):
        # The label's meaning turns over at the change: the features say what they said.
        sea = stream.name.startswith("sea")
        source = iter(synth.SEA(variant=0, seed=seed) if sea else synth.Agrawal(0, seed=seed))
        for i, (x, y) in enumerate(itertools.islice(source, stream.length)):
            flipped = stream.change is not None and i >= stream.change
            yield {str(k): float(v) for k, v in x.items()}, (1 - int(y)) if flipped else int(y)
        return
    if stream.name == "sea-abrupt":
        rows: Iterator[Any] = itertools.chain(
            synth.SEA(variant=0, seed=seed).take(before),
            synth.SEA(variant=3, seed=seed + 1).take(after),
        )
    elif stream.name == "sea-gradual":
        width = max(100, after // 2)
        rows = synth.ConceptDriftStream(
            synth.SEA(variant=1, seed=seed),
            synth.SEA(variant=2, seed=seed + 1),
            position=before + width // 2,
            width=width,
            seed=seed,
        ).take(stream.length)
    else:  # agrawal-abrupt
        rows = itertools.chain(
            synth.Agrawal(0, seed=seed).take(before), synth.Agrawal(2, seed=seed + 1).take(after)
        )
    for x, y in rows:
        yield {(f"x{k}" if isinstance(k, int) else str(k)): float(v) for k, v in x.items()}, int(y)


def table_files(stream: Stream, folder: Path) -> tuple[Path, Path]:
    """The stream as JSON lines (``label``: "c0"/"c1", classes by name), and an evaluation
    file of the concept before the change."""
    data, evaluation = folder / f"{stream.name}.jsonl", folder / f"{stream.name}-eval.jsonl"
    with open(data, "w") as f:
        for x, y in table_rows(stream):
            f.write(json.dumps({**x, "label": f"c{y}"}) + "\n")
    head = Stream(stream.name, stream.kind, None, min(2_000, stream.change or 2_000))
    with open(evaluation, "w") as f:
        for x, y in table_rows(head, seed=99):
            f.write(json.dumps({**x, "label": f"c{y}"}) + "\n")
    return data, evaluation
