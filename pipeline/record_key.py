"""The Kafka key of a record: its id, 8 bytes big-endian unsigned (numpy only).

The key names a record across replays, so what is decided by it holds on every run: the
held-out share is a hash of the key, never a draw.

Example:
    >>> import numpy as np
    >>> decode_keys(encode_keys(np.array([7, 8]))).tolist()
    [7, 8]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pipeline.codec import as_buffer


def encode_keys(ids: np.ndarray) -> list[bytes]:
    """Record ids as Kafka keys (8-byte big-endian).

    >>> encode_keys(np.array([1]))
    [b'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x01']
    """
    return [row.tobytes() for row in np.asarray(ids, ">u8").reshape(-1, 1).view(np.uint8)]


def decode_keys(keys: Sequence[bytes]) -> np.ndarray:
    """Inverse of :func:`encode_keys`.

    >>> decode_keys(encode_keys(np.array([5, 2**40]))).tolist()
    [5, 1099511627776]
    """
    return np.frombuffer(b"".join(keys), ">u8").astype(np.uint64)


def decode_key_array(keys: Any) -> np.ndarray | None:
    """Record ids from a block of keys (list or pyarrow array) in one pass, or None unless
    every key is an 8-byte id.

    >>> decode_key_array(encode_keys(np.array([3, 4]))).tolist()
    [3, 4]
    >>> decode_key_array([b"abc"]) is None
    True
    """
    data, offsets = as_buffer(keys)
    if not len(offsets) - 1 or not (np.diff(offsets) == 8).all():
        return None
    return np.frombuffer(data[offsets[0] : offsets[-1]].tobytes(), ">u8").astype(np.uint64)


def held_out(keys: Sequence[bytes | None], offsets: np.ndarray, share: float) -> np.ndarray:
    """Which records a share holds out, by a hash of the key (of the offset for a record
    without one): the same records on every run and every replay.

    >>> held_out([b"a", b"b", None, b"d", b"e", b"f"], np.arange(6), 0.5).tolist()
    [False, False, False, False, True, True]
    """
    import zlib

    if share <= 0:
        return np.zeros(len(keys), bool)
    cut = round(share * 10_000)
    return np.array(
        [
            zlib.crc32(k if k is not None else int(o).to_bytes(8, "big")) % 10_000 < cut
            for k, o in zip(keys, offsets.tolist(), strict=True)
        ],
        bool,
    )
