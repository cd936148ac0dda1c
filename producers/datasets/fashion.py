"""Fashion-MNIST (Zalando) from IDX files; Debian's `dataset-fashion-mnist` path by default."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pipeline import codec
from pipeline.errors import DataError
from producers.datasets import _idx
from producers.datasets.base import Chunk, Dataset, check_split, chunk_arrays

#: Where `apt-get install dataset-fashion-mnist` puts the files.
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")


class FashionMnist(Dataset):
    """Fashion-MNIST, 60k train and 10k test 28x28 images in 10 classes.

    Args:
        path: folder with the four IDX files; default: ``<data-dir>/fashion-mnist``,
            then Debian's ``/usr/share/datasets/fashion-mnist``.
    """

    name = "fashion-mnist"
    builtin = True
    schema = codec.FASHION_MNIST

    def __init__(self, path: str | Path | None = None, *, data_dir: Path | None = None) -> None:
        super().__init__()
        candidates = (
            [Path(path)]
            if path
            else [p for p in (data_dir and data_dir / "fashion-mnist", DEBIAN_DIR) if p]
        )
        folder = next((c for c in candidates if _idx.find_idx(c, "train")), None)
        if folder is None:
            raise DataError(
                f"Expected Fashion-MNIST IDX files in {' or '.join(map(str, candidates))}; none "
                "found. Install Debian's dataset-fashion-mnist or pass the folder holding "
                "train-images-idx3-ubyte.gz."
            )
        self.folder: Path = folder

    def iter_chunks(self, split: str = "train", *, chunk_rows: int = 4096) -> Iterator[Chunk]:
        x, y = _idx.load_idx_split(self.folder, check_split(split))
        yield from chunk_arrays(x, y, chunk_rows)

    def num_rows(self, split: str = "train") -> int | None:
        files = _idx.find_idx(self.folder, check_split(split))
        return len(_idx.read_idx(files[1])) if files else 0
