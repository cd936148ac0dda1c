"""IDX files (the original MNIST / Fashion-MNIST format), plain or gzipped."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from pipeline.errors import DataError

#: IDX file stems of each split, as LeCun and Zalando name them.
STEMS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file of unsigned bytes into an array of its declared shape."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] != 0x08:
        raise DataError(
            f"Expected an IDX file of unsigned bytes at {path}. Received a file that is not one."
        )
    ndim = raw[3]
    dims = np.frombuffer(raw, ">u4", count=ndim, offset=4).astype(int)
    body = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise DataError(
            f"{path} declares shape {tuple(dims)} but holds {body.size} values; the file is "
            "truncated."
        )
    return body.reshape(tuple(dims))


def find_idx(folder: Path, split: str) -> tuple[Path, Path] | None:
    """The (images, labels) files of ``split`` in ``folder``, gzipped or not, if both exist."""
    found = []
    for stem in STEMS[split]:
        candidates = [folder / stem, folder / f"{stem}.gz"]
        hit = next((p for p in candidates if p.is_file()), None)
        if hit is None:
            return None
        found.append(hit)
    return found[0], found[1]


def load_idx_split(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images ``(n, 784)`` uint8 and labels ``(n,)`` of one split."""
    files = find_idx(folder, split)
    if files is None:
        raise DataError(
            f"Expected IDX files {STEMS[split]} (optionally .gz) in {folder}; they are not there."
        )
    images, labels = (read_idx(p) for p in files)
    if len(images) != len(labels):
        raise DataError(
            f"{files[0]} has {len(images)} images but {files[1]} has {len(labels)} labels."
        )
    return images.reshape(len(images), -1), labels.astype(np.int32)
