"""The weights' type on the socket: float32, or half the bytes as bfloat16 or float16.

The server's center, the rules and the workers' replicas stay float32; only the payload on
the socket is narrowed, by the sender, and widened back by the receiver (shared memory moves
no bytes over a network, and stays float32). A request says its payload's type, and the
type it wants the weights back in, in its flags (:data:`FLAGS`).

* bfloat16 keeps float32's exponent (its range: no delta or weight overflows) and 8 bits of
  its significand, rounded to nearest even: a relative error of at most 2**-9.
* float16 keeps 11 bits of significand but a range of +-65504, and values below 6e-5 lose
  precision (subnormals): for weights and deltas known to be small and not tiny.

Both convert into buffers allocated once. bfloat16 converts with ml_dtypes' numpy type
(0.6 ms to narrow the CNN's 4 MB here, 0.1 ms to widen); numpy's own float16 takes 4.5 ms
and 2.5 ms, more than the halved bytes save on loopback.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["FLAGS", "MASK", "NAMES", "decode", "encode", "itemsize", "name_of", "overflowed"]

#: The wire types by name, and their request flags (bits 1-2 of a request's flags).
FLAGS = {"float32": 0, "bfloat16": 2, "float16": 4}
MASK = 6
NAMES = tuple(FLAGS)


def itemsize(flag: int) -> int:
    """Bytes per weight on the socket for a request's wire flag.

    >>> itemsize(FLAGS["float32"]), itemsize(FLAGS["bfloat16"])
    (4, 2)
    """
    return 4 if flag == 0 else 2


def name_of(flag: int) -> str | None:
    """The wire type a request's flags name (None: not one).

    >>> name_of(2), name_of(6)
    ('bfloat16', None)
    """
    return next((name for name, f in FLAGS.items() if f == flag & MASK), None)


def encode(values: np.ndarray, flag: int, out: np.ndarray) -> memoryview:
    """``values`` (float32) as the wire type into ``out`` (uint16, as many), rounded to
    nearest even (a NaN stays a NaN; a float16 past its range becomes an Inf, which the
    server refuses as not finite); its bytes.

    >>> out = np.empty(3, np.uint16)
    >>> x = np.array([1.0, -2.5, 1 + 2**-8 + 2**-10], np.float32)
    >>> decode(
    ...     encode(x, FLAGS["bfloat16"], out), FLAGS["bfloat16"], np.empty(3, np.float32)
    ... ).tolist()
    [1.0, -2.5, 1.0078125]
    """
    with np.errstate(over="ignore"):  # past float16's range: an Inf, which overflowed() reports
        np.copyto(
            out.view(np.float16 if flag == FLAGS["float16"] else ml_dtypes.bfloat16),
            values,
            casting="same_kind",
        )
    return out.data.cast("B")


def overflowed(values: np.ndarray, narrowed: np.ndarray, flag: int) -> bool:
    """Whether finite ``values`` went past the wire type's range in ``narrowed`` (float16
    only: bfloat16 has float32's range). Values already not finite are the server's to
    refuse (a diverged model), not a range's.

    >>> out = np.empty(2, np.uint16)
    >>> big = np.array([1.0, 1e5], np.float32)
    >>> _ = encode(big, FLAGS["float16"], out); overflowed(big, out, FLAGS["float16"])
    True
    >>> _ = encode(big, FLAGS["bfloat16"], out); overflowed(big, out, FLAGS["bfloat16"])
    False
    """
    if flag != FLAGS["float16"] or np.isfinite(narrowed.view(np.float16)).all():
        return False
    return bool(np.isfinite(values).all())


def decode(payload: memoryview | bytes | bytearray, flag: int, out: np.ndarray) -> np.ndarray:
    """The wire bytes ``payload`` widened to float32 into ``out``; returns ``out``."""
    np.copyto(
        out, np.frombuffer(payload, np.float16 if flag == FLAGS["float16"] else ml_dtypes.bfloat16)
    )
    return out
