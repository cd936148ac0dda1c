"""Distributed training algorithms, one module each, behind a name registry.

Example:
    >>> from pipeline.train import algorithms
    >>> algorithms.get("adag").name
    'adag'
    >>> algorithms.get(
    ...     {"name": "downpour", "config": {"communication_window": 3}}
    ... ).communication_window
    3
    >>> sorted(algorithms.NAMES)
    ['adag', 'aeasgd', 'agn', 'averaging', 'downpour', 'dynsgd', 'eamsgd', 'single', 'sync']
"""

from __future__ import annotations

from typing import Any

from pipeline.errors import ConfigError
from pipeline.train.algorithms.adag import ADAG
from pipeline.train.algorithms.aeasgd import AEASGD
from pipeline.train.algorithms.agn import AGN
from pipeline.train.algorithms.averaging import ModelAveraging
from pipeline.train.algorithms.base import Algorithm, ExchangeClient
from pipeline.train.algorithms.downpour import Downpour
from pipeline.train.algorithms.dynsgd import DynSGD
from pipeline.train.algorithms.eamsgd import EAMSGD
from pipeline.train.algorithms.single import Single
from pipeline.train.algorithms.sync import SyncSGD

_REGISTRY: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (Single, SyncSGD, ModelAveraging, Downpour, AGN, ADAG, AEASGD, EAMSGD, DynSGD)
}
NAMES = tuple(_REGISTRY)


def get(identifier: str | dict[str, Any] | Algorithm, **overrides: Any) -> Algorithm:
    """An algorithm from a name, a ``{"name", "config"}`` dict, or an instance.

    ``overrides`` (e.g. ``num_workers=4``) are applied on top of the config.
    """
    if isinstance(identifier, Algorithm):
        if not overrides:
            return identifier
        identifier = serialize(identifier)
    if isinstance(identifier, str):
        name, config = identifier, {}
    elif isinstance(identifier, dict) and "name" in identifier:
        name, config = identifier["name"], dict(identifier.get("config", {}))
    else:
        raise ConfigError(
            f"Expected an algorithm name, a {{'name', 'config'}} dict or an Algorithm. "
            f"Received: {identifier!r}"
        )
    try:
        cls = _REGISTRY[name.lower()]
    except KeyError:
        raise ConfigError(f"Unknown algorithm {name!r}; expected one of {list(NAMES)}.") from None
    try:
        return cls.from_config({**config, **overrides})
    except TypeError as e:
        raise ConfigError(f"Bad settings for algorithm {name!r}: {e}") from None


def serialize(algorithm: Algorithm) -> dict[str, Any]:
    """``{"name": ..., "config": ...}``, what :func:`get` takes back."""
    return {"name": algorithm.name, "config": algorithm.get_config()}


__all__ = [
    "ADAG",
    "AEASGD",
    "AGN",
    "EAMSGD",
    "NAMES",
    "Algorithm",
    "Downpour",
    "DynSGD",
    "ExchangeClient",
    "ModelAveraging",
    "Single",
    "SyncSGD",
    "get",
    "serialize",
]
