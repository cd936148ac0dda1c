"""Lazy re-exports for a package's ``__init__``: each name imports its module on first use,
so importing a package never starts Spark or TensorFlow.

Example:
    >>> from pipeline import exports
    >>> getattr_ = exports.lazy("demo", {"dumps": "json"})
    >>> getattr_("dumps")([1])
    '[1]'
    >>> getattr_("loads")
    Traceback (most recent call last):
    ...
    AttributeError: module 'demo' has no attribute 'loads'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package`` that finds each of ``names`` (name -> module
    path) in its module, imported on first use.

    A name must not be that of a module in the package: once the module is imported, it
    is the package's attribute and this function is never asked (``tests/test_architecture.py``
    checks it).
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
