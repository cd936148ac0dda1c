"""Generic arrays: an NPZ of features and class labels, N float32 features a record."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipeline import codec
from pipeline.errors import ConfigError, DataError
from producers.datasets.base import Chunk, Dataset, check_split, chunk_arrays


def _label_ok(labels: np.ndarray, num_classes: int | None) -> np.ndarray:
    ok = (labels == np.rint(labels)) & (labels >= 0)
    return ok & (labels < num_classes) if num_classes else ok


class Npz(Dataset):
    """An NPZ of features and labels: ``x_train``/``y_train``/``x_test``/``y_test`` (Keras
    layout) or one pair named by ``x_key``/``y_key`` (train split only)."""

    name = "npz"
    options = ("num_classes",)

    def __init__(
        self,
        path: str | Path,
        *,
        x_key: str = "x",
        y_key: str = "y",
        num_classes: int | None = None,
    ) -> None:
        super().__init__()
        path = Path(path)
        if not path.is_file():
            raise DataError(f"Expected an .npz file at {path}, found nothing there.")
        with np.load(path, allow_pickle=False) as f:
            keys = set(f.files)
            pairs = {"train": ("x_train", "y_train"), "test": ("x_test", "y_test")}
            if not {"x_train", "y_train"} <= keys:
                if not {x_key, y_key} <= keys:
                    raise DataError(
                        f"Expected arrays x_train/y_train or {x_key!r}/{y_key!r} in {path}. "
                        f"Received: {sorted(keys)}"
                    )
                pairs = {"train": (x_key, y_key)}
            self._arrays = {s: (f[xk], f[yk]) for s, (xk, yk) in pairs.items() if {xk, yk} <= keys}
        x, _ = self._arrays["train"]
        n_features = int(np.prod(x.shape[1:]))
        self.num_classes = num_classes
        self.schema = codec.generic(n_features, num_classes or 2**31 - 1)

    def iter_chunks(self, split: str = "train", *, chunk_rows: int = 4096) -> Iterator[Chunk]:
        if check_split(split) not in self._arrays:
            raise ConfigError("This NPZ has no test split (x_test/y_test).")
        x, y = self._arrays[split]
        x = x.reshape(len(x), -1).astype(np.float32)
        y = np.asarray(y).reshape(-1).astype(np.float64)
        finite, label_ok = np.isfinite(x).all(axis=1), _label_ok(y, self.num_classes)
        ok = finite & label_ok
        # Rows are numbered from 1, as lines are in a CSV.
        self.check_rows(
            np.arange(1, len(y) + 1), ok, [(~finite, "non_finite"), (~label_ok, "bad_label")]
        )
        yield from chunk_arrays(x[ok], y[ok].astype(np.int32), chunk_rows)

    def num_rows(self, split: str = "train") -> int | None:
        pair = self._arrays.get(check_split(split))
        return len(pair[1]) if pair else 0
