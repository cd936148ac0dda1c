"""Why a server refuses: the reasons each refusal counter counts by.

A counter creates each reason's series at 0 when the server starts, so that rate() sees the
first refusal; :mod:`~pipeline.observe.metrics` declares the counters.
"""

from __future__ import annotations

#: Why a model server refuses a request (``serve_bad_requests_total``'s reasons, each a
#: series from the start so that rate() sees the first refusal).
SERVE_REFUSALS = (
    "bad_field",
    "bad_json",
    "busy",
    "content_type",
    "malformed",
    "no_features",
    "no_instances",
    "no_length",
    "not_numeric",
    "number_too_large",
    "out_of_range",
    "slow_body",
    "slow_head",
    "string_too_long",
    "too_deep",
    "too_large",
    "too_many_instances",
    "too_many_values",
    "unauthorized",
    "unknown_field",
    "wrong_host",
    "wrong_shape",
)

#: Why the parameter server refuses a connection or a request (each a series from the start).
PS_REFUSALS = (
    "auth",
    "busy",
    "evicted",
    "frame",
    "handshake",
    "idle",
    "nonfinite",
    "order",
    "size",
    "truncated",
)
