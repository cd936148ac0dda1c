"""Update rules: how the server changes the center from one pushed buffer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: ``rule(center, delta, staleness=..., pulled=...)`` changes ``center`` in place.
Rule = Callable[..., None]


def add_delta(center: np.ndarray, delta: np.ndarray, **_: Any) -> None:
    """The DOWNPOUR rule, and every algorithm's default: center += delta.

    >>> center = np.ones(2, np.float32)
    >>> add_delta(center, np.array([1, -1], np.float32))
    >>> center.tolist()
    [2.0, 0.0]
    """
    np.add(center, delta, out=center)
