"""The bounds of every histogram's buckets, each with why it falls where it does.

Prometheus reads a quantile by interpolating inside a bucket, so a bound belongs where the
values a histogram sees cluster; :mod:`~pipeline.observe.metrics` declares the histograms.

Example:
    >>> BATCH_SECONDS[0], BATCH_SECONDS[-1]
    (0.5, 3600)
"""

from __future__ import annotations


def integer_buckets(*bounds: int) -> tuple[float, ...]:
    """Histogram buckets for whole numbers: each bound k gets a bucket (k - 0.01, k] of its
    own. Histogram quantiles interpolate inside a bucket, so a constant k reads as k (within
    0.01), where buckets (1, 2] made a constant 2 read p50 1.5.

    >>> integer_buckets(0, 1, 2)
    (0.0, 0.99, 1.0, 1.99, 2.0)
    """
    return tuple(b for k in bounds for b in ((float(k),) if k <= 0 else (k - 0.01, float(k))))


#: Staleness: a whole number of updates (a constant 1 read p50 0.5 with buckets (0, 1]).
INTEGER = integer_buckets(0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
#: Instances per prediction request: clients send a few, or a batch of a power of two.
INSTANCES = integer_buckets(1, 2, 3, 4, 5, 6, 8, 10, 16, 32, 64, 128, 256, 512, 1024)


#: Micro-batch seconds: a second to an hour, tight where batches usually fall (4-30 s),
#: so p50 of 8-17 s batches reads within their bucket and a 431 s batch reads as one.
BATCH_SECONDS = (
    0.5,
    1,
    2,
    4,
    6,
    8,
    10,
    12,
    15,
    20,
    25,
    30,
    45,
    60,
    90,
    120,
    180,
    300,
    450,
    600,
    900,
    1800,
    3600,
)

#: The model's freshness: a quarter second (a target of seconds) to an hour (a stalled run).
FRESHNESS_SECONDS = (
    0.25,
    0.5,
    0.75,
    1,
    1.5,
    2,
    3,
    4,
    6,
    8,
    10,
    15,
    20,
    30,
    60,
    120,
    300,
    600,
    1800,
    3600,
)

#: Parameter-server request seconds: half a millisecond to a minute (a pull behind a
#: synchronous round waits for the slowest worker).
PS_SECONDS = (
    0.0005,
    0.001,
    0.002,
    0.004,
    0.008,
    0.016,
    0.032,
    0.064,
    0.128,
    0.25,
    0.5,
    1,
    2,
    5,
    10,
    30,
    60,
)
