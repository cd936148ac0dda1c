"""Optimizers that run on the parameter server, in NumPy, on the flat weight buffer.

Synchronous SGD keeps one optimizer, on the server, for the whole job: workers
push gradients, the server applies their mean. The rules are Keras 3's (same
defaults, same bias correction), so a job with one worker follows the same path
as ``model.fit`` with that optimizer. Every step works in place on preallocated
buffers: the MNIST CNN's million weights take a few milliseconds per step.

A step is on every worker's critical path (a synchronous round's workers all wait
for it), and each weight's update depends on that weight alone, so a large vector
is updated in two halves at once: NumPy lets go of the GIL inside each operation,
and the workers waiting on the round leave their cores free. Each element goes
through the same operations in the same order, so the result is the same, bit for bit.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from pipeline.errors import ConfigError

#: Below this many weights a step is a few tens of microseconds: a second thread costs more.
SPLIT_MIN = 1 << 17

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    # A forked child has the pool object but not its thread: work sent to it would never run.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def _cores() -> int:
    """The cores this process may run on (all of them where the platform cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _helper() -> ThreadPoolExecutor | None:
    """The process's one helper thread for the second half (None on one core)."""
    global _pool
    with _pool_lock:
        if _pool is None and _cores() > 1:
            _pool = ThreadPoolExecutor(1, thread_name_prefix="streamtrain-optimizer")
        return _pool


def in_halves(size: int, step: Callable[[slice], None]) -> None:
    """Call ``step`` on ``slice(0, size)``, or, for a large ``size`` on a machine with more
    than one core, on its two halves at once (the second on a helper thread).

    >>> seen = []
    >>> in_halves(10, seen.append); seen
    [slice(0, 10, None)]
    >>> seen.clear(); in_halves(SPLIT_MIN, seen.append)  # in two halves where there are two cores
    >>> [i for s in sorted(seen, key=lambda s: s.start) for i in range(s.start, s.stop)] == list(
    ...     range(SPLIT_MIN)
    ... )  # every weight once
    True
    """
    pool = _helper() if size >= SPLIT_MIN else None
    if pool is None:
        step(slice(0, size))
        return
    half = size // 2
    try:
        other = pool.submit(step, slice(half, size))
    except RuntimeError:  # the interpreter is shutting down: no new work for the helper
        step(slice(0, size))
        return
    try:
        step(slice(0, half))
    finally:
        other.result()


class ServerOptimizer:
    """Updates a flat float32 vector in place from a gradient; its state is named arrays."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.iterations = 0
        #: Multiplies the learning rate (``--on-drift adapt`` raises it for a while); not state.
        self.lr_scale = 1.0

    def apply(self, weights: np.ndarray, grad: np.ndarray) -> None:
        raise NotImplementedError

    def state(self) -> dict[str, np.ndarray]:
        """Copies of everything :meth:`apply` depends on (for a checkpoint)."""
        return {
            "iterations": np.array(self.iterations, np.int64),
            **{k: v.copy() for k, v in self._slots().items()},
        }

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore what :meth:`state` returned."""
        slots = self._slots()
        missing = [k for k in ("iterations", *slots) if k not in state]
        if missing:
            raise ConfigError(
                f"Expected optimizer state with {sorted(['iterations', *slots])}. Missing: "
                f"{missing}"
            )
        for k, v in slots.items():
            np.copyto(v, np.asarray(state[k], np.float32).reshape(v.shape))
        self.iterations = int(state["iterations"])

    def _slots(self) -> dict[str, np.ndarray]:
        return {}


class Adam(ServerOptimizer):
    """Adam as Keras 3 computes it.

    Example:
        >>> w = np.zeros(2, np.float32)
        >>> opt = Adam(2, learning_rate=0.1)
        >>> opt.apply(w, np.array([1.0, -2.0], np.float32))
        >>> w.astype(float).round(4).tolist()  # first step: -lr * sign
        [-0.1, 0.1]
    """

    def __init__(
        self,
        size: int,
        *,
        learning_rate: float = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
    ) -> None:
        super().__init__(size)
        self.learning_rate, self.beta_1, self.beta_2, self.epsilon = (
            learning_rate,
            beta_1,
            beta_2,
            epsilon,
        )
        self.m = np.zeros(size, np.float32)
        self.v = np.zeros(size, np.float32)
        self._tmp = np.empty(size, np.float32)

    def _slots(self) -> dict[str, np.ndarray]:
        return {"m": self.m, "v": self.v}

    def apply(self, weights: np.ndarray, grad: np.ndarray) -> None:
        self.iterations += 1
        b1, b2, t = self.beta_1, self.beta_2, self.iterations
        alpha = np.float32(self.learning_rate * self.lr_scale * np.sqrt(1 - b2**t) / (1 - b1**t))
        c1, c2, eps = np.float32(1 - b1), np.float32(1 - b2), np.float32(self.epsilon)

        def step(part: slice) -> None:
            m, v, g, tmp = self.m[part], self.v[part], grad[part], self._tmp[part]
            # m += (g - m) * (1 - b1), v += (g^2 - v) * (1 - b2): Keras's forms, in place.
            np.subtract(g, m, out=tmp)
            tmp *= c1
            m += tmp
            np.square(g, out=tmp)
            tmp -= v
            tmp *= c2
            v += tmp
            np.sqrt(v, out=tmp)
            tmp += eps
            np.divide(m, tmp, out=tmp)
            tmp *= alpha
            w = weights[part]  # a view: ``weights[part] -= tmp`` would copy it back onto itself
            w -= tmp

        in_halves(self.size, step)


class SGD(ServerOptimizer):
    """SGD with optional (Nesterov) momentum, as Keras 3 computes it.

    Example:
        >>> w = np.ones(2, np.float32)
        >>> SGD(2, learning_rate=0.5).apply(w, np.array([1.0, 2.0], np.float32)); w.tolist()
        [0.5, 0.0]
    """

    def __init__(
        self,
        size: int,
        *,
        learning_rate: float = 0.01,
        momentum: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        super().__init__(size)
        self.learning_rate, self.momentum, self.nesterov = learning_rate, momentum, nesterov
        self.velocity = np.zeros(size, np.float32)
        self._tmp = np.empty(size, np.float32)

    def _slots(self) -> dict[str, np.ndarray]:
        return {"velocity": self.velocity} if self.momentum else {}

    def apply(self, weights: np.ndarray, grad: np.ndarray) -> None:
        self.iterations += 1
        lr = np.float32(self.learning_rate * self.lr_scale)
        if not self.momentum:
            np.multiply(grad, lr, out=self._tmp)
            weights -= self._tmp
            return
        # velocity = momentum * velocity - lr * g; w += velocity (+ momentum * velocity - lr * g if
        # Nesterov)
        self.velocity *= np.float32(self.momentum)
        np.multiply(grad, lr, out=self._tmp)
        self.velocity -= self._tmp
        if self.nesterov:
            weights += self.velocity * np.float32(self.momentum) - self._tmp
        else:
            weights += self.velocity


_KINDS = {"adam": Adam, "sgd": SGD}


def get(identifier: str | dict[str, Any], size: int) -> ServerOptimizer:
    """A server optimizer from a Keras optimizer name or ``{"class_name", "config"}`` dict.

    Only the settings that change the update are read; Keras's bookkeeping ones
    (``name``, ``jit_compile``, ...) are ignored. Schedules and other optimizers
    are refused with the list of what works.

    >>> get(
    ...     {"class_name": "Adam", "config": {"learning_rate": 0.002, "name": "adam"}}, 3
    ... ).learning_rate
    0.002
    """
    name, config = (
        (identifier, {})
        if isinstance(identifier, str)
        else (str(identifier.get("class_name", "")), dict(identifier.get("config", {})))
    )
    cls = _KINDS.get(name.lower())
    if cls is None:
        raise ConfigError(
            "Synchronous SGD runs the optimizer on the parameter server, which knows "
            f"{sorted(_KINDS)}. Received: {name!r}. Pass worker_optimizer='adam' or 'sgd'."
        )
    wanted = {
        "adam": ("learning_rate", "beta_1", "beta_2", "epsilon"),
        "sgd": ("learning_rate", "momentum", "nesterov"),
    }[name.lower()]
    settings = {k: config[k] for k in wanted if k in config and config[k] is not None}
    if not isinstance(settings.get("learning_rate", 0.0), int | float):
        raise ConfigError(
            f"Expected a number for the server optimizer's learning_rate. "
            f"Received: {settings['learning_rate']!r} (schedules are not supported)"
        )
    if config.get("amsgrad"):
        raise ConfigError("The server's Adam has no amsgrad variant. Received: amsgrad=True")
    return cls(size, **settings)
