"""Optimizers that run on the parameter server, in NumPy, on the flat weight buffer.

Synchronous SGD keeps one optimizer, on the server, for the whole job: workers
push gradients, the server applies their mean. The rules are Keras 3's (same
defaults, same bias correction), so a job with one worker follows the same path
as ``model.fit`` with that optimizer. Every step works in place on preallocated
buffers: the MNIST CNN's million weights take a few milliseconds per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.errors import ConfigError


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
        b1, b2, t, tmp = self.beta_1, self.beta_2, self.iterations, self._tmp
        alpha = np.float32(self.learning_rate * self.lr_scale * np.sqrt(1 - b2**t) / (1 - b1**t))
        # m += (g - m) * (1 - b1), v += (g^2 - v) * (1 - b2): Keras's forms, in place.
        np.subtract(grad, self.m, out=tmp)
        tmp *= np.float32(1 - b1)
        self.m += tmp
        np.square(grad, out=tmp)
        tmp -= self.v
        tmp *= np.float32(1 - b2)
        self.v += tmp
        np.sqrt(self.v, out=tmp)
        tmp += np.float32(self.epsilon)
        np.divide(self.m, tmp, out=tmp)
        tmp *= alpha
        weights -= tmp


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
