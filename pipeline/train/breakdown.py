"""Where a run's time went: every task slot's share of the stream's wall time, from the
model's compute to the gaps between micro-batches.

A run with ``slots`` task slots over ``wall_s`` seconds of streaming has ``slots x wall_s``
slot-seconds to spend; the figures the tasks and the driver measure split them:

- ``compute``: the model's forward and backward passes (``TaskResult.compute_s``);
- ``exchange``: workers blocked on the parameter server (serialize, transport, the
  server's apply, a synchronous round's wait);
- ``read_decode``: fetching the range from Kafka and decoding it;
- ``task_other``: the rest of a task in Python (the replica, the connection, the
  prequential score, shuffling);
- ``in_batch_idle``: slots idle while the batch ran (Spark launching tasks, a task that
  finished before the slowest);
- ``checkpoint``: the driver's write of the checkpoint after each batch, which every slot
  waits for (its cost is per batch: smaller batches, for a freshness target, pay it more often);
- ``commit``: the rest of the driver's per-batch work (checking the tasks, releasing records);
- ``trigger``: the rest, between batches: Spark's trigger, the source's planning, its offset
  and commit logs (and waiting for records, on a stream that runs dry).

Held-out scoring is left out of the wall time, as the run's ``records_per_s_excluding_eval``
leaves it out.

A synchronous run's exchange is split further (:func:`exchange_parts`) by what its
parameter server measures: the pushes' wait for the round's other workers, their wait for
its optimizer step, and the rest.
"""

from __future__ import annotations

from typing import Any

PARTS = (
    "compute",
    "exchange",
    "read_decode",
    "task_other",
    "in_batch_idle",
    "checkpoint",
    "commit",
    "trigger",
)


class Breakdown:
    """Running totals over a run's batches, and the shares they make of its slot time.

    Example:
        >>> b = Breakdown()
        >>> b.add(
        ...     batch_s=4.0,
        ...     commit_s=0.5,
        ...     read_decode_s=0.4,
        ...     compute_s=5.8,
        ...     exchange_s=0.9,
        ...     task_s=7.0,
        ...     checkpoint_s=0.2,
        ... )
        >>> s = b.shares(slots=2, wall_s=5.0)
        >>> (
        ...     s["compute"],
        ...     s["exchange"],
        ...     s["in_batch_idle"],
        ...     s["checkpoint"],
        ...     s["commit"],
        ...     s["trigger"],
        ... )
        (0.58, 0.09, 0.06, 0.04, 0.06, 0.1)
        >>> round(sum(s.values()), 6)
        1.0
    """

    def __init__(self) -> None:
        self.batches = 0
        self.seconds = dict.fromkeys(
            ("compute", "exchange", "read_decode", "task", "batch", "commit", "checkpoint"), 0.0
        )

    def add(
        self,
        *,
        batch_s: float,
        commit_s: float,
        read_decode_s: float,
        compute_s: float,
        exchange_s: float,
        task_s: float,
        checkpoint_s: float = 0.0,
    ) -> None:
        """One batch: its tasks' wall time on the driver and the driver's commit after them
        (``checkpoint_s`` of it writing the checkpoint); and summed over its tasks, their
        seconds reading and decoding, computing, exchanging, and in training (``task_s``:
        from the decoded block to the task's result)."""
        self.batches += 1
        for key, seconds in (
            ("batch", batch_s),
            ("commit", commit_s),
            ("read_decode", read_decode_s),
            ("compute", compute_s),
            ("exchange", exchange_s),
            ("task", task_s),
            ("checkpoint", min(checkpoint_s, commit_s)),
        ):
            self.seconds[key] += seconds

    def shares(self, *, slots: int, wall_s: float, eval_s: float = 0.0) -> dict[str, float]:
        """Each part's share of ``slots x (wall_s - eval_s)`` slot-seconds, to two decimals;
        ``trigger`` is what the others leave (never below 0)."""
        total = max(1, slots) * max(1e-9, wall_s - eval_s)
        s = self.seconds
        other = max(0.0, s["task"] - s["compute"] - s["exchange"])
        idle = max(0.0, max(1, slots) * s["batch"] - s["read_decode"] - s["task"])
        slot = max(1, slots)
        parts = {
            "compute": s["compute"],
            "exchange": s["exchange"],
            "read_decode": s["read_decode"],
            "task_other": other,
            "in_batch_idle": idle,
            "checkpoint": slot * s["checkpoint"],
            "commit": slot * (s["commit"] - s["checkpoint"]),
        }
        parts["trigger"] = max(0.0, total - sum(parts.values()))
        return {k: round(v / total, 2) for k, v in parts.items()}

    def state(self) -> dict[str, Any]:
        """The totals, as the report keeps them."""
        return {"batches": self.batches, **{k: round(v, 3) for k, v in self.seconds.items()}}


def exchange_parts(exchange_s: float, ps_stats: dict[str, Any]) -> dict[str, float]:
    """The workers' ``exchange_s`` seconds as shares, to two decimals: waiting for the rest of a
    synchronous round (a peer still computing: the workers' jitter, or a straggler), waiting
    for the round's optimizer step on the server, and the rest (moving the gradient and the
    new weights, and loading these into the replica). Empty without synchronous rounds.

    >>> exchange_parts(10.0, {"round_wait_s": 4.0, "round_step_s": 2.5})
    {'round_wait': 0.4, 'server_step': 0.25, 'transfer_and_load': 0.35}
    >>> exchange_parts(10.0, {"round_wait_s": 0, "round_step_s": 0})
    {}
    """
    wait, step = float(ps_stats.get("round_wait_s") or 0), float(ps_stats.get("round_step_s") or 0)
    if exchange_s <= 0 or wait + step <= 0:
        return {}
    wait = min(wait, exchange_s)
    step = min(step, exchange_s - wait)
    return {
        "round_wait": round(wait / exchange_s, 2),
        "server_step": round(step / exchange_s, 2),
        "transfer_and_load": round((exchange_s - wait - step) / exchange_s, 2),
    }
