"""The parameter server set up for an algorithm and a model (the online run and the batch
Trainer both start theirs here)."""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from pipeline.train import algorithms, ps
from pipeline.train.model import ModelSpec


def parameter_server(algorithm: algorithms.Algorithm, spec: ModelSpec, weights: np.ndarray, *, host: str,
                     port: int = 0, sync_timeout_s: float = 30.0, shared_memory: bool = True,
                     on_request: Callable[[str, float], None] | None = None,
                     on_refusal: Callable[[str], None] | None = None, clock: int = 0,
                     optimizer: dict[str, np.ndarray] | None = None) -> ps.ParameterServer:
    """A parameter server (not yet started) that applies ``algorithm``'s rule to ``spec``'s
    weights, with a fresh secret.

    Args:
        weights, clock, optimizer: where it starts: the center, its clock and the rule's
            state (a resumed run's checkpoint; a new one starts at clock 0 with none).
    """
    algorithm.bind(spec)
    if optimizer:
        algorithm.load_server_state(optimizer)
    return ps.ParameterServer(
        weights, secret=os.urandom(32), host=host, port=port, rule=algorithm.apply, keep_pulled=algorithm.keep_pulled,
        sync_workers=algorithm.num_workers if algorithm.synchronous else 0, sync_timeout_s=sync_timeout_s,
        on_request=on_request, on_refusal=on_refusal, state=algorithm, shared_memory=shared_memory, clock=clock,
    )
