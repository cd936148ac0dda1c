"""The wire format: exact round trips and a named reject for every bad record."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pipeline import codec, record_key


@settings(max_examples=50, deadline=None)
@given(n=st.integers(0, 40), seed=st.integers(0, 2**31 - 1))
def test_mnist_round_trip_is_exact(n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (n, 784), dtype=np.uint8)
    y = rng.integers(0, 10, n)
    out = codec.decode(codec.encode(x, y, codec.MNIST), codec.MNIST)
    assert np.array_equal(out.x, x) and np.array_equal(out.y, y)
    assert out.rejected.size == 0 and out.accepted.tolist() == list(range(n))


@settings(max_examples=50, deadline=None)
@given(
    x=hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 30), st.just(28)),
        elements=st.floats(allow_nan=False, allow_infinity=False, width=32),
    )
)
def test_higgs_round_trip_is_bit_exact(x: np.ndarray) -> None:
    y = np.arange(len(x)) % 2
    out = codec.decode(pa.array(codec.encode(x, y, codec.HIGGS), pa.binary()), codec.HIGGS)
    assert out.x.tobytes() == x.tobytes() and out.y.tolist() == y.tolist()


def test_every_reject_reason_is_named_and_good_records_survive() -> None:
    schema = codec.generic(3, 4)
    good = codec.encode(np.ones((1, 3), np.float32), np.array([2]), schema)[0]
    inf = codec.encode(np.array([[1, np.inf, 0]], np.float32), np.array([0]), schema)[0]
    higgs_record = codec.encode(np.ones((1, 28), np.float32), np.array([1]), codec.HIGGS)[0]
    wrong_schema = bytes([1, 3]) + good[2:]
    values = [
        good,
        b"",
        good[:-1],
        b"\x07" + good[1:],
        wrong_schema,
        codec.encode(np.ones((1, 3), np.float32), np.array([4]), schema)[0],
        codec.encode(np.ones((1, 3), np.float32), np.array([-1]), schema)[0],
        inf,
        higgs_record,
        good,
    ]
    out = codec.decode(values, schema)
    assert out.accepted.tolist() == [0, 9]
    assert out.reason_names() == [
        "wrong_length",
        "wrong_length",
        "unknown_version",
        "wrong_schema",
        "label_out_of_range",
        "label_out_of_range",
        "non_finite",
        "wrong_length",
    ]
    assert out.reject_counts() == {
        "wrong_length": 3,
        "unknown_version": 1,
        "wrong_schema": 1,
        "label_out_of_range": 2,
        "non_finite": 1,
    }
    assert out.x.tolist() == [[1, 1, 1], [1, 1, 1]]


def test_decode_takes_a_sliced_arrow_array_with_nulls_without_copying_the_data() -> None:
    x = np.arange(5 * 784, dtype=np.int64).reshape(5, 784).astype(np.uint8)
    values = codec.encode(x, np.arange(5), codec.MNIST)
    arr = pa.array([*values, None], pa.binary()).slice(1)
    out = codec.decode(arr, codec.MNIST)
    assert np.array_equal(out.x, x[1:]) and out.reason_names() == ["wrong_length"]


def test_empty_input() -> None:
    out = codec.decode([], codec.MNIST)
    assert out.x.shape == (0, 784) and out.reject_counts() == {}


def test_keys_round_trip() -> None:
    ids = np.array([0, 1, 2**63 + 5], np.uint64)
    assert record_key.decode_keys(record_key.encode_keys(ids)).tolist() == ids.tolist()
