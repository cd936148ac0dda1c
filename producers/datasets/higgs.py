"""HIGGS (UCI): 11M collision events, label then 28 features, streamed from CSV or CSV.gz.

The UCI convention keeps the last 500,000 rows as the test set; this reader's
train split is the first ``train_rows`` rows of the file and the test split the
rest. The 7,000 + 500 row sample shipped with the package (``samples/higgs``) comes
as two files, and is read where the user's data folder holds no HIGGS.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipeline import codec, config
from pipeline.errors import DataError
from producers.datasets import _csv
from producers.datasets.base import Chunk, Dataset, check_split

log = logging.getLogger(__name__)

UCI_URL = "https://archive.ics.uci.edu/static/public/280/higgs.zip"
UCI_TRAIN_ROWS = 10_500_000
_FULL_NAMES = ("HIGGS.csv.gz", "HIGGS.csv")
_SAMPLE = ("higgs_lgbm_train_7000.csv", "higgs_lgbm_test_500.csv")


#: The real 7,000 + 500 row sample that travels with the package (see its PROVENANCE.md).
SAMPLE_DIR = Path(__file__).resolve().parent / "samples" / "higgs"


def resolve(path: str | Path | None, data_dir: Path | None) -> tuple[Path, Path | None]:
    """(train file, separate test file or None) for a path, or the data folder's HIGGS.

    Without a path, the user's data folder is searched first (the full file, then a
    sample there), then the sample shipped with the package.
    """
    if path is not None and Path(path).is_file():
        return Path(path), None
    folders = [Path(path)] if path else [(data_dir or config.data_dir()) / "higgs", SAMPLE_DIR]
    for folder in folders:
        found = _in_folder(folder)
        if found is not None:
            if folder == SAMPLE_DIR:
                log.info(
                    "HIGGS: no HIGGS.csv.gz in %s; reading the 7,000-row sample shipped with "
                    "streamtrain (`streamtrain data fetch higgs` gets the full set)",
                    folders[0],
                )
            return found
    raise DataError(
        f"Expected HIGGS.csv.gz (or the 7,000-row sample) in {folders[0]}; found nothing. "
        "Run `streamtrain data fetch higgs`, or pass the file's path."
    )


def _in_folder(folder: Path) -> tuple[Path, Path | None] | None:
    for name in _FULL_NAMES:
        if (folder / name).is_file():
            return folder / name, None
    if (folder / _SAMPLE[0]).is_file():
        test = folder / _SAMPLE[1]
        return folder / _SAMPLE[0], test if test.is_file() else None
    return None


class Higgs(Dataset):
    """HIGGS events: 28 float32 features, label 1 (signal) or 0 (background).

    Args:
        path: a HIGGS CSV/CSV.gz file or a folder holding one (default: ``<data-dir>/higgs``).
        test_path: a separate test file; without one the test split is the rows
            after ``train_rows`` in the same file.
        train_rows: rows of the train split in a single file (UCI: 10,500,000).
    """

    name = "higgs"
    builtin = True
    options = ("test_path",)
    schema = codec.HIGGS

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        test_path: str | Path | None = None,
        train_rows: int = UCI_TRAIN_ROWS,
        data_dir: Path | None = None,
    ) -> None:
        super().__init__()
        self.train_file, found_test = resolve(path, data_dir)
        self.test_file = Path(test_path) if test_path else found_test
        self.train_rows = train_rows

    def iter_chunks(self, split: str = "train", *, chunk_rows: int = 4096) -> Iterator[Chunk]:
        if check_split(split) == "test" and self.test_file is not None:
            rows = _csv.iter_numeric_rows(self.test_file, block_rows=chunk_rows)
        elif split == "test":
            rows = _csv.iter_numeric_rows(
                self.train_file, block_rows=chunk_rows, skip_rows=self.train_rows
            )
        else:
            rows = _csv.iter_numeric_rows(
                self.train_file, block_rows=chunk_rows, max_rows=self.train_rows
            )
        next_id = 0
        for parsed in rows:
            block = parsed.rows
            if block.shape[1] != 1 + codec.HIGGS.n_features:
                raise DataError(
                    f"Expected {1 + codec.HIGGS.n_features} columns (label, then 28 features) in "
                    f"{self.train_file}. Received: {block.shape[1]}"
                )
            label = block[:, 0]
            finite, label_ok = _csv.finite_rows(block), (label == 0) | (label == 1)
            ok = finite & label_ok
            self.check_rows(
                parsed.lines, ok, [(~finite, "non_finite"), (~label_ok, "bad_label")], parsed.bad
            )
            n = int(ok.sum())
            ids = np.arange(next_id, next_id + n, dtype=np.uint64)
            next_id += n
            if n:
                yield Chunk(ids, block[ok, 1:].astype(np.float32), label[ok].astype(np.int32))


def fetch(dest_dir: Path | None = None) -> Path:
    """Download the UCI HIGGS archive and keep ``HIGGS.csv.gz`` in ``<data-dir>/higgs``.

    The archive's own CRC-32 of the file is checked as it is extracted, and the gzip
    stream read to its end: a damaged download is one line and leaves nothing behind.
    (UCI publishes no digest of the archive; MNIST's download is sha256-pinned.)
    """
    import gzip
    import zipfile
    import zlib

    folder = (dest_dir or config.data_dir()) / "higgs"
    target = folder / "HIGGS.csv.gz"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        archive = Path(tmp) / "higgs.zip"
        try:
            with urllib.request.urlopen(UCI_URL, timeout=30) as r, open(archive, "wb") as out:  # noqa: S310
                shutil.copyfileobj(r, out, 1 << 20)
        except OSError as e:
            raise DataError(
                f"Cannot download HIGGS from {UCI_URL} ({e}). Download HIGGS.csv.gz by hand into "
                f"{folder}."
            ) from None
        try:
            with zipfile.ZipFile(archive) as z:
                member = next((n for n in z.namelist() if n.endswith("HIGGS.csv.gz")), None)
                if member is None:
                    raise DataError(
                        f"The archive from {UCI_URL} holds no HIGGS.csv.gz: {z.namelist()}"
                    )
                with z.open(member) as src, open(Path(tmp) / "HIGGS.csv.gz", "wb") as out:
                    shutil.copyfileobj(src, out, 1 << 20)  # raises on a CRC-32 that does not match
            with gzip.open(Path(tmp) / "HIGGS.csv.gz", "rb") as check:
                while check.read(1 << 24):
                    pass
        except (zipfile.BadZipFile, EOFError, zlib.error, gzip.BadGzipFile) as e:
            raise DataError(
                f"The HIGGS download from {UCI_URL} is damaged ({e}); nothing was saved. Run "
                f"streamtrain data fetch higgs again, or put HIGGS.csv.gz into {folder} by hand."
            ) from None
        (Path(tmp) / "HIGGS.csv.gz").replace(target)
    log.info("HIGGS saved to %s", target)
    return target
