"""A sharded parameter server (``--ps-shards N``): N processes, each serving one slice of
the weights, behind the interface the driver and the batch Trainer use.

Each shard is a :class:`~pipeline.train.ps.server.ParameterServer` over its slice
(:func:`pipeline.train.ps.shards.plan`), with its own port, clock, task table and rule: the
algorithm is rebuilt in the child from :func:`pipeline.train.algorithms.serialize` and bound
to its slice (:meth:`~pipeline.train.model.ModelSpec.piece`), so that a server-side
optimizer keeps its state per slice. The child is a fresh
``python -m pipeline.train.shard_process`` (the driver holds Spark's JVM gateway, threads
and sockets: no fork), gets its settings
and the run's secret on a socket pair only the driver holds (never argv or the
environment), dies with its parent, and answers the driver's requests (checkpoint,
restore, stats, a task's applied count) on that pair: no new operation reaches the network, where a
RESTORE would be a way to overwrite the center.

:class:`ShardedServer` gathers the shards into one server: a checkpoint is one consistent
cut (taken between micro-batches, when no task exchanges: every shard's clock must agree,
else it refuses), a task's applied count must agree on every shard, and the rule's state
of each slice is joined into the full-size state that one server would hold (so a
checkpoint reads the same, and resumes, with any number of shards).
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Any

import numpy as np

from pipeline.errors import StreamtrainError
from pipeline.train import algorithms, shard_process
from pipeline.train.model import ModelSpec
from pipeline.train.ps.shards import Shard, plan

log = logging.getLogger(__name__)


class ShardedServer:
    """N parameter-server processes over contiguous slices of the weights, as one server.

    Args:
        algorithm: the run's algorithm (each shard rebuilds it from its config).
        spec: the model (its weight shapes decide the slices).
        weights, clock, optimizer: where it starts (the rule's state full-size, as a
            checkpoint holds it).
        shards: how many shard processes (2 or more).
        secret: the run's secret (every shard proves it).
        host, port: the address each shard binds; with a port other than 0, shard ``i``
            binds ``port + i``.
        sync_timeout_s, shared_memory, straggler_wait: as for
            :class:`~pipeline.train.ps.server.ParameterServer`.
    """

    def __init__(
        self,
        algorithm: algorithms.Algorithm,
        spec: ModelSpec,
        weights: np.ndarray,
        *,
        shards: int,
        secret: bytes,
        host: str,
        port: int = 0,
        sync_timeout_s: float = 30.0,
        shared_memory: bool = True,
        clock: int = 0,
        optimizer: dict[str, np.ndarray] | None = None,
        straggler_wait: float = 0.0,
    ) -> None:
        self.size, self.secret, self.host, self.port = spec.size, secret, host, port
        self.slices = plan([int(np.prod(s)) for s in spec.shapes], shards)
        flat = np.asarray(weights, np.float32).ravel()
        config = algorithms.serialize(algorithm)
        self._jobs = [
            {
                "algorithm": config,
                "spec": spec.piece(a, b).to_json(),
                "weights": flat[a:b].copy(),
                "clock": clock,
                "optimizer": _slice_state(optimizer or {}, a, b, self.size),
                "secret": secret,
                "host": host,
                "port": port + i if port else 0,
                "sync_timeout_s": sync_timeout_s,
                "shared_memory": shared_memory,
                "straggler_wait": straggler_wait,
            }
            for i, (a, b) in enumerate(self.slices)
        ]
        self.shards: tuple[Shard, ...] = ()
        self._children = shard_process.Children(self._jobs, "Parameter-server shard")

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    # --- life cycle ---

    def start(self) -> ShardedServer:
        ports = self._children.start()
        self.port = ports[0]
        self.shards = tuple(
            (self.host, port, a, b) for port, (a, b) in zip(ports, self.slices, strict=True)
        )
        log.info(
            "parameter server: %d shards at %s",
            len(self.shards),
            ", ".join(f"{h}:{p} [{a}:{b}]" for h, p, a, b in self.shards),
        )
        return self

    def stop(self) -> None:
        """Stop every shard (asked first, killed by its pid 10 s later); their ports are free on
        return."""
        self._children.stop()

    def __enter__(self) -> ShardedServer:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _ask(self, op: str, args: list[Any] | None = None) -> list[Any]:
        return self._children.ask(op, args)

    def weights(self) -> np.ndarray:
        """The center weights, every shard's slice."""
        return np.concatenate(self._ask("weights"))

    def snapshot(self) -> tuple[np.ndarray, int]:
        """The center weights and the clock (the oldest shard's, while tasks exchange)."""
        parts = self._ask("snapshot")
        return np.concatenate([w for w, _ in parts]), min(c for _, c in parts)

    def checkpoint(self) -> tuple[np.ndarray, int, dict[str, np.ndarray]]:
        """The center, the clock and the rule's state, one consistent cut of every shard.

        Taken between micro-batches, when no task exchanges: every push went to every
        shard, so each applied as many. Their clocks may still differ: a synchronous round
        closes on each shard as its pushes come, and a worker killed between its shards
        lands its push in different rounds; the checkpoint keeps the highest. Shards that
        applied different pushes (one reached some shards and not others, which a task's
        retry would level) are refused with one line.
        """
        parts = self._ask("checkpoint")
        pushes = [n for _, _, _, n in parts]
        if len(set(pushes)) > 1:
            raise StreamtrainError(
                "The parameter-server shards applied different pushes "
                f"({', '.join(map(str, pushes))}): an update reached some shards and not others, "
                "so there is no consistent checkpoint; the batch is not saved. Resume the run "
                "from its last checkpoint."
            )
        return (
            np.concatenate([w for w, _, _, _ in parts]),
            max(c for _, c, _, _ in parts),
            _join_states([s for _, _, s, _ in parts], self.slices),
        )

    def restore(
        self, weights: np.ndarray, clock: int, state: dict[str, np.ndarray] | None = None
    ) -> None:
        """Replace every shard's slice of the center, the clock and the rule's state."""
        flat = np.asarray(weights, np.float32).ravel()
        if flat.size != self.size:
            raise StreamtrainError(
                f"Expected {self.size} weights to restore. Received: {flat.size}"
            )
        self._ask(
            "restore",
            [
                (flat[a:b], clock, _slice_state(state or {}, a, b, self.size))
                for a, b in self.slices
            ],
        )

    def expect_workers(self, n: int) -> None:
        """How many workers the next synchronous rounds wait for, on every shard."""
        self._ask("expect", [n] * len(self.slices))

    def scale_learning_rate(self, scale: float) -> bool:
        """Every shard's optimizer steps with ``scale`` times its configured learning rate
        from now on (``--on-drift adapt``); whether they have one (synchronous SGD's)."""
        return all(self._ask("lr_scale", [scale] * len(self.slices)))

    def applied(self, task: int) -> tuple[int, int]:
        """The exchanges of ``task`` applied and the mini-batches they covered: the same on
        every shard, or an error that names the shards' counts."""
        counts = self._ask("applied", [task] * len(self.slices))
        if len(set(counts)) > 1:
            raise StreamtrainError(
                f"The parameter-server shards applied different exchanges of one task "
                f"({', '.join(f'{e} exchanges, {s} mini-batches' for e, s in counts)}); "
                "the batch is not committed. Resume the run from its last checkpoint."
            )
        return counts[0][0], counts[0][1]

    def stats(self) -> dict[str, Any]:
        """The first shard's figures (every request reaches every shard), with the clock the
        oldest shard's, the size the whole buffer's, refusals summed, and each shard's
        figures under ``shards``."""
        each = self._ask("stats")
        refused: dict[str, int] = {}
        for s in each:
            for reason, n in s["refused"].items():
                refused[reason] = refused.get(reason, 0) + n
        return {
            **each[0],
            "clock": min(s["clock"] for s in each),
            "size": self.size,
            "refused": refused,
            "repeats_dropped": max(s["repeats_dropped"] for s in each),
            # A push waits on every shard at once: the largest shard's totals (a lower bound on
            # what the workers waited, as the slowest shard of each round may differ).
            **{k: max(s.get(k, 0) for s in each) for k in ("round_wait_s", "round_step_s")},
            "shards": each,
        }


def _slice_state(
    state: dict[str, np.ndarray], start: int, stop: int, size: int
) -> dict[str, np.ndarray]:
    """A rule's full-size state cut to one slice: arrays of one value per weight are cut,
    the rest (an optimizer's step count) kept whole.

    >>> _slice_state({"m": np.arange(4.0), "iterations": np.array(3)}, 1, 3, 4)
    {'m': array([1., 2.]), 'iterations': array(3)}
    """
    return {
        k: (np.asarray(v)[start:stop] if np.ndim(v) == 1 and len(v) == size else np.asarray(v))
        for k, v in state.items()
    }


#: The rule state that counts the optimizer's steps (Keras's name, kept by the server's optimizers).
STEP_COUNT = "iterations"


def _join_states(
    states: list[dict[str, np.ndarray]], slices: list[tuple[int, int]]
) -> dict[str, np.ndarray]:
    """The shards' states of the rule joined into the full-size one: per-weight arrays
    concatenated, the rest the same on every shard (else there is no consistent cut),
    except the optimizer's step count: synchronous rounds close on each shard as its
    pushes come, so shards that applied the same pushes may have taken different numbers
    of steps; the highest is kept (it only scales Adam's bias correction, which one step
    more moves by under 0.6% after the first hundred).

    >>> _join_states(
    ...     [
    ...         {"m": np.zeros(2), "iterations": np.array(3)},
    ...         {"m": np.ones(1), "iterations": np.array(4)},
    ...     ],
    ...     [(0, 2), (2, 3)],
    ... )
    {'m': array([0., 0., 1.]), 'iterations': array(4)}
    """
    joined: dict[str, np.ndarray] = {}
    for key in states[0] if states else {}:
        parts = [np.asarray(s[key]) for s in states]
        if all(p.ndim == 1 and len(p) == b - a for p, (a, b) in zip(parts, slices, strict=True)):
            joined[key] = np.concatenate(parts)
        elif all(np.array_equal(p, parts[0]) for p in parts):
            joined[key] = parts[0]
        elif key == STEP_COUNT and all(p.ndim == 0 for p in parts):
            joined[key] = max(parts, key=int)
        else:
            raise StreamtrainError(
                f"The parameter-server shards' rule state {key!r} disagrees between shards: "
                "there is no consistent checkpoint. Resume the run from its last checkpoint."
            )
    return joined
