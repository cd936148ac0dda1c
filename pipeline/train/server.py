"""The parameter server set up for an algorithm and a model (the online run and the batch
Trainer both start theirs here): one in this process, or with ``shards`` > 1 a
:class:`~pipeline.train.sharded.ShardedServer` of that many processes."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from pipeline.train import algorithms, ps
from pipeline.train.model import ModelSpec
from pipeline.train.ps.rounds import STRAGGLER_WAIT

if TYPE_CHECKING:
    from pipeline.train.sharded import ShardedServer

#: What the driver and the Trainer hold: one server, or the facade of its shards.
Server: TypeAlias = "ps.ParameterServer | ShardedServer"


def parameter_server(
    algorithm: algorithms.Algorithm,
    spec: ModelSpec,
    weights: np.ndarray,
    *,
    host: str,
    port: int = 0,
    sync_timeout_s: float = 30.0,
    shared_memory: bool = True,
    on_request: Callable[[str, float], None] | None = None,
    on_refusal: Callable[[str], None] | None = None,
    on_event: Callable[[str], None] | None = None,
    straggler_wait: float = STRAGGLER_WAIT,
    clock: int = 0,
    optimizer: dict[str, np.ndarray] | None = None,
    secret: bytes | None = None,
    shards: int = 1,
) -> ps.ParameterServer | ShardedServer:
    """A parameter server (not yet started) that applies ``algorithm``'s rule to ``spec``'s
    weights, with a fresh secret (or ``secret``).

    Args:
        weights, clock, optimizer: where it starts: the center, its clock and the rule's
            state (a resumed run's checkpoint; a new one starts at clock 0 with none).
        shards: 1, this process's own server (as before shards existed); more, that many
            processes over slices of the weights (``on_request`` and ``on_refusal`` are
            then not called: the shards count in their :meth:`stats`).
        on_event: short synchronous rounds and workers' broken connections (one server only).
        straggler_wait: how long a synchronous round waits for a straggler, as a share of its
            first pusher's pace (0: for every worker).

    One server's synchronous rounds go on without a straggler (:mod:`pipeline.train.ps.rounds`);
    shards wait for every worker, so that their clocks stay one cut for the checkpoint.
    """
    secret = secret or os.urandom(32)
    if shards > 1:
        from pipeline.train.sharded import ShardedServer

        return ShardedServer(
            algorithm,
            spec,
            weights,
            shards=shards,
            secret=secret,
            host=host,
            port=port,
            sync_timeout_s=sync_timeout_s,
            shared_memory=shared_memory,
            clock=clock,
            optimizer=optimizer,
            straggler_wait=straggler_wait,
        )
    algorithm.bind(spec)
    if optimizer:
        algorithm.load_server_state(optimizer)
    return ps.ParameterServer(
        weights,
        secret=secret,
        host=host,
        port=port,
        rule=algorithm.apply,
        keep_pulled=algorithm.keep_pulled,
        sync_workers=algorithm.num_workers if algorithm.synchronous else 0,
        sync_timeout_s=sync_timeout_s,
        straggler_wait=straggler_wait,
        on_request=on_request,
        on_refusal=on_refusal,
        on_event=on_event,
        state=algorithm,
        shared_memory=shared_memory,
        clock=clock,
    )
