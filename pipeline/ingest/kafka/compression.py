"""Kafka's record-batch codecs (gzip, snappy, lz4, zstd), inflated with ``cramjam`` under a size
cap.

A record batch names its codec in the low three bits of its attributes. Every codec
inflates into one buffer of ``max_bytes + 1`` bytes allocated up front (untouched pages
cost nothing), so a compression bomb stops at the cap with an error instead of taking
the executor's memory. Kafka's snappy comes in two framings: the Java client writes
xerial's (a magic header, then length-prefixed raw snappy blocks), librdkafka raw
snappy; both are read. Kafka's lz4 is the LZ4 frame format; zstd and gzip are their
standard frames.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from pipeline.errors import BrokerError

#: Codec names by the id a batch's attributes carry.
CODECS = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

#: The largest batch the readers inflate by default (Kafka's own limit on a batch is
#: the broker's message.max.bytes, ~1 MiB by default; replay batches are far smaller).
DEFAULT_MAX_BYTES = 256 << 20

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16  # magic, version, compatible version


class CodecError(BrokerError):
    """A compressed batch could not be inflated: corrupt, an unknown codec, or over the cap."""


def codec_name(codec: int) -> str:
    """The name of codec id ``codec`` (Kafka's ``compression.type``).

    >>> codec_name(4), codec_name(7)
    ('zstd', 'unknown codec 7')
    """
    return CODECS.get(codec, f"unknown codec {codec}")


def _xerial_blocks(payload: bytes | memoryview) -> list[memoryview]:
    """The raw snappy blocks of a xerial-framed payload.

    >>> import cramjam
    >>> block = bytes(cramjam.snappy.compress_raw(b"abc"))
    >>> framed = _XERIAL_MAGIC + bytes(8) + len(block).to_bytes(4, "big") + block
    >>> [bytes(b) == block for b in _xerial_blocks(framed)]
    [True]
    """
    view, pos, blocks = memoryview(payload), _XERIAL_HEADER, []
    while pos < len(view):
        if pos + 4 > len(view):
            raise CodecError("a xerial snappy block header is cut short")
        (n,) = struct.unpack_from(">i", view, pos)
        if n < 0 or pos + 4 + n > len(view):
            raise CodecError("a xerial snappy block is longer than its batch")
        blocks.append(view[pos + 4 : pos + 4 + n])
        pos += 4 + n
    return blocks


def _snappy(payload: bytes | memoryview, out: np.ndarray) -> int:
    import cramjam

    raw = bytes(payload[: len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC
    blocks = [memoryview(payload)] if raw else _xerial_blocks(payload)
    # Raw snappy states its inflated length first: the cap is checked before any work.
    sizes = [cramjam.snappy.decompress_raw_len(b) for b in blocks]
    if sum(sizes) > len(out) - 1:
        raise CodecError(
            f"it inflates to {sum(sizes)} bytes, more than the cap of {len(out) - 1} bytes"
        )
    pos = 0
    for block, size in zip(blocks, sizes, strict=True):
        pos += cramjam.snappy.decompress_raw_into(block, out[pos : pos + size].data)
    return pos


def inflate(
    codec: int,
    payload: bytes | memoryview,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    pad: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The records of a compressed batch (the bytes after its 61-byte header), as uint8.

    Args:
        codec: the codec id from the batch's attributes (1 gzip, 2 snappy, 3 lz4, 4 zstd).
        payload: the compressed bytes.
        max_bytes: the most bytes the records may inflate to.
        pad: zero bytes to add after the inflated ones (room for vectorized reads past the end).
        out: a uint8 buffer of at least ``max_bytes + 1 + pad`` bytes to inflate into (a
            reader reuses one: its pages are mapped already); None: a new one.

    Returns:
        The inflated bytes and ``pad`` zeros (a view of one buffer: no copy).

    Raises:
        CodecError: an unknown codec, corrupt data, or more than ``max_bytes`` inflated.

    Example:
        >>> import cramjam
        >>> data = b"a kafka record " * 100
        >>> [
        ...     bytes(inflate(c, bytes(f(data)))) == data
        ...     for c, f in [
        ...         (1, cramjam.gzip.compress),
        ...         (2, cramjam.snappy.compress_raw),
        ...         (3, cramjam.lz4.compress),
        ...         (4, cramjam.zstd.compress),
        ...     ]
        ... ]
        [True, True, True, True]
        >>> inflate(
        ...     4, bytes(cramjam.zstd.compress(bytes(10_000))), max_bytes=1000
        ... )  # doctest: +NORMALIZE_WHITESPACE
        Traceback (most recent call last):
        ...
        pipeline.ingest.kafka.compression.CodecError: Cannot inflate a zstd batch: it inflates to
        more than the cap of 1000 bytes
    """
    import cramjam

    name = codec_name(codec)
    decoders: dict[int, Any] = {
        1: cramjam.gzip.decompress_into,
        3: cramjam.lz4.decompress_into,
        4: cramjam.zstd.decompress_into,
    }
    if codec not in decoders and codec != 2:
        raise CodecError(f"Cannot inflate a batch with {name}: Kafka defines codecs 1-4 only")
    # One byte beyond the cap: a payload that fills it is over the cap, whatever the
    # library says when it runs out of room.
    if out is None or len(out) < max_bytes + 1 + pad:
        out = np.empty(max_bytes + 1 + pad, np.uint8)
    room = out[: max_bytes + 1]
    try:
        n = _snappy(payload, room) if codec == 2 else decoders[codec](bytes(payload), room.data)
    except CodecError as e:
        raise CodecError(f"Cannot inflate a {name} batch: {e}") from None
    except Exception as e:  # cramjam's DecompressionError, for corrupt data or no room left
        full = "whole buffer" in str(e) or "smaller than required" in str(e)
        why = (
            f"it inflates to more than the cap of {max_bytes} bytes"
            if full
            else f"corrupt data ({e})"
        )
        raise CodecError(f"Cannot inflate a {name} batch: {why}") from None
    if n > max_bytes:
        raise CodecError(
            f"Cannot inflate a {name} batch: it inflates to more than the cap of {max_bytes} bytes"
        )
    out[n : n + pad] = 0
    return out[: n + pad]


def deflate(codec: int, data: bytes) -> bytes:
    """``data`` compressed as codec id ``codec`` writes it in a batch (for tests and tools;
    snappy as librdkafka writes it, raw).

    >>> bytes(inflate(3, deflate(3, b"xyz")))
    b'xyz'
    """
    import cramjam

    if codec == 0:
        return data
    encoders: dict[int, Any] = {
        1: cramjam.gzip.compress,
        2: cramjam.snappy.compress_raw,
        3: cramjam.lz4.compress,
        4: cramjam.zstd.compress,
    }
    if codec not in encoders:
        raise CodecError(f"Cannot deflate with {codec_name(codec)}: Kafka defines codecs 0-4 only")
    return bytes(encoders[codec](data))
