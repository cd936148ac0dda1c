"""Training one partition on an executor: the resident replica, the algorithm's worker
half, and the exchanges with the parameter server."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from pipeline.train import algorithms, ps
from pipeline.train.id_rows import IdRows
from pipeline.train.model import ModelSpec, input_shape
from pipeline.train.replica import replica


@dataclasses.dataclass(frozen=True)
class ServerInfo:
    """How a worker reaches the parameter server (the secret travels in Spark's task, never
    logged)."""

    host: str
    port: int
    secret: bytes = dataclasses.field(repr=False)
    wire_dtype: str = "float32"  # the payloads' type on TCP (pipeline.train.ps.wire)
    #: With a sharded server (``--ps-shards``), each shard's host, port and slice of the weights.
    shards: tuple[tuple[str, int, int, int], ...] = ()
    #: With ID features, each row server's host and port, in shard order; and the tables' row
    #: sizes, in the servers' order.
    rows: tuple[tuple[str, int], ...] = ()
    row_dims: tuple[int, ...] = ()

    @classmethod
    def of(cls, server: Any, wire_dtype: str = "float32", rows: Any = None) -> ServerInfo:
        """How workers reach ``server`` (one parameter server, or a sharded one), and the
        row servers ``rows`` (:class:`~pipeline.train.row_servers.RowServers`) where the model
        has ID features."""
        return cls(
            server.host,
            server.port,
            server.secret,
            wire_dtype,
            tuple(getattr(server, "shards", ())),
            tuple(rows.addresses) if rows is not None else (),
            tuple(rows.dims) if rows is not None else (),
        )

    def row_client(self, worker: int) -> Any:
        """A connection to every row server (None without ID features)."""
        if not self.rows:
            return None
        from pipeline.train.ps.row_client import RowClient

        return RowClient(self.rows, secret=self.secret, worker=worker, dims=list(self.row_dims))


@dataclasses.dataclass
class TaskResult:
    """What training one task did: one worker, one partition (an offset range, or a Trainer's
    shard).

    Attributes:
        worker: the worker's id.
        records, steps, exchanges: records trained (over all epochs), mini-batches, exchanges.
        loss_first, loss_last: mean loss of the first and the last ten mini-batches.
        staleness: per push, the server updates it missed (see the algorithm's worker half).
        compute_s, exchange_s: seconds computing, and exchanging with the server.
        fresh_replica: whether the replica was built for this partition.
        preq_n, preq_loss, preq_acc: the prequential (test-then-train) score of the
            first pass: records, mean loss, mean accuracy.
        task: the range's key on the parameter server (0: pushes named no task).
        steps_total: the partition's mini-batches over all epochs, in every attempt.
        steps_skipped: of those, the ones an earlier attempt of this task already had
            applied, which this attempt skipped (Spark retried the task).
        repeats: pushes the server dropped as repeats (a speculative copy ran beside it).
        attempt: Spark's attempt number for the task.
        shared_memory: whether its exchanges went through shared memory (else TCP).
        wire_dtype: the payloads' type on TCP (``--wire-dtype``; shared memory moves float32).
        diverged: why the task stopped, when the server refused its update as not finite
            (its model diverged: a retry would compute the same); None: it trained.
        preq_losses, preq_errors: the first pass's mini-batch losses and error rates (1 -
            accuracy; NaN: none), in the order trained (the loss drift signal's input,
            :mod:`pipeline.train.drift`).
        label_counts: records per class (None: a numeric target).
        sample_x: a sample of the records' features (tables: the feature drift signal).
        heldout_x, heldout_y, held_out: records held out of training after a drift
            (:mod:`pipeline.train.adapt`), and how many.
        rows_read, rows_pushed, row_staleness, rows_s: an ID model's rows read and pushed,
            per push of them the row servers' updates it missed, and the seconds its requests
            to the row servers took (part of ``exchange_s``).
        preq_hist: a binary classifier's first-pass scores (the positive class's, before
            each mini-batch trained) in :data:`HIST_BINS` equal bins over [0, 1]: the
            negatives' counts, then the positives' (the prequential AUC; None: no such model).
    """

    worker: int
    records: int
    steps: int
    exchanges: int
    loss_first: float
    loss_last: float
    staleness: list[int]
    compute_s: float
    exchange_s: float
    fresh_replica: bool
    preq_n: int = 0
    preq_loss: float = float("nan")
    preq_acc: float = float("nan")
    task: int = 0
    steps_total: int = 0
    steps_skipped: int = 0
    repeats: int = 0
    attempt: int = 0
    shared_memory: bool = False
    wire_dtype: str = "float32"
    diverged: str | None = None
    preq_losses: list[float] = dataclasses.field(default_factory=list)
    preq_errors: list[float] = dataclasses.field(default_factory=list)
    label_counts: list[int] | None = None
    sample_x: np.ndarray | None = None
    heldout_x: np.ndarray | None = None
    heldout_y: np.ndarray | None = None
    held_out: int = 0
    rows_read: int = 0
    rows_pushed: int = 0
    row_staleness: list[int] = dataclasses.field(default_factory=list)
    rows_s: float = 0.0
    preq_hist: list[list[int]] | None = None


def _labels(loss: str, y: np.ndarray, classes: int) -> np.ndarray:
    """Labels in the one form the replica's traced train function takes (another dtype
    would make TensorFlow trace it again)."""
    if loss == "categorical_crossentropy" and y.ndim == 1:
        return np.eye(classes, dtype=np.float32)[y]
    return y.astype(np.int32 if loss.startswith("sparse") else np.float32, copy=False)


def train_partition(
    x: np.ndarray,
    y: np.ndarray,
    *,
    spec: ModelSpec,
    algorithm: dict[str, object],
    server: ServerInfo,
    worker: int,
    job: str,
    epochs: int = 1,
    threads: int = 1,
    seed: int | Sequence[int] | None = None,
    task: int = 0,
    attempt: int = 0,
    after_exchange: Callable[[int], None] | None = None,
    lr_scale: float = 1.0,
    layout: Any = None,
    sightings: bool = True,
) -> TaskResult:
    """Train on one partition's ``x``/``y`` with the algorithm's exchanges; report figures.

    The replica starts from the server's center; the algorithm's worker half
    (:meth:`~pipeline.train.algorithms.Algorithm.worker`) learns from every mini-batch
    and exchanges every ``communication_window`` of them, and once more at the end so
    that no step is lost. The prequential (test-then-train) loss and accuracy come free
    from the first pass: each step's loss and accuracy are those of its forward pass, on
    weights that have not yet seen that mini-batch.

    With a ``task`` key (:func:`pipeline.train.ps.protocol.task_key`) every push names the
    task and its exchange, and the server applies each exchange once: an attempt that
    Spark runs again after a failure skips the mini-batches whose exchanges an earlier
    attempt had applied (``seed`` must then fix the order, so that every attempt draws
    the same mini-batches) and trains on from there. ``after_exchange`` is called with
    each exchange's index (fault injection). ``lr_scale`` multiplies the replica's
    learning rate (``--on-drift adapt``).

    With a ``layout`` (:class:`~pipeline.table.ids.IdLayout`: the schema has ID features)
    ``x`` holds the IDs' keys, and each mini-batch's rows are read from the row servers and
    trained there (:class:`~pipeline.train.id_rows.IdRows`); the first pass's pushes count
    the IDs as seen (none with ``sightings`` False: records trained again after a drift).
    """
    algo = algorithms.get(algorithm)
    entry, fresh = replica(spec, job=job, threads=threads, lr_scale=lr_scale)
    entry.input_grads = layout is not None
    y = _labels(
        spec.loss, y, spec.shapes[-1][-1]
    )  # the output layer's bias: subclassed models have no .outputs
    shape = input_shape(entry.model)
    if layout is None and x.shape[1:] != shape:
        x = x.reshape((len(x), *shape))
    # Mini-batches are drawn in a fresh random order each epoch, as model.fit does: a
    # stream repeats the producer's order (every epoch of a replay is the same), and
    # always seeing the same neighbours costs accuracy. ``seed`` makes it repeatable.
    rng = np.random.default_rng(None if seed is None else [*np.atleast_1d(seed).tolist(), worker])
    batch, window = algo.worker_batch_size, algo.communication_window
    n = len(x)
    steps_per_epoch = math.ceil(n / batch) if n else 0
    total = epochs * steps_per_epoch
    losses: list[float] = []
    preq = np.zeros(3)  # records, summed loss, summed accuracy over the first pass
    preq_losses: list[float] = []
    preq_errors: list[float] = []
    # A binary classifier's prequential scores, binned (an AUC needs them, not a mean).
    binary = spec.shapes[-1][-1] in (1, 2) and spec.loss in (
        "sparse_categorical_crossentropy",
        "binary_crossentropy",
    )
    hist = np.zeros((2, HIST_BINS), np.int64) if binary else None
    timer = _Timer()
    ids: IdRows | None = None
    try:
        with (
            contextlib.ExitStack() as stack,
            ps.connect(
                (server.host, server.port),
                server.shards,
                secret=server.secret,
                worker=worker,
                size=spec.size,
                wire_dtype=server.wire_dtype,
                retry_s=CONNECT_RETRY_S,
            ) as client,
        ):
            if layout is not None:
                rows = stack.enter_context(server.row_client(worker))
                ids = IdRows(layout, rows, task)
            with timer("exchange"):
                done = client.begin(task, steps=total, window=window) if task else 0
                done = ids.level(client, done, window, total) if ids is not None else done
                pulled = client.pull().copy()
                entry.weights.set(pulled)
            skipped = min(total, done * window)
            half = algo.worker(client, entry, pulled)
            order = list(_minibatches(rng, n, batch, epochs))
            for step, idx in enumerate(order, start=1):
                if step <= skipped:  # applied by an earlier attempt: drawn, not trained
                    continue
                xb = x[idx]
                if ids is not None:
                    with timer("exchange"):
                        xb = ids.before(xb)
                with timer("compute"):
                    loss, acc = half.compute(xb, y[idx])
                if ids is not None:  # its request sent, its reply taken after the exchange
                    ids.client.sighting = sightings and step <= steps_per_epoch
                    with timer("exchange"):
                        ids.after(step, half.input_grad, x[order[step]] if step < total else None)
                losses.append(loss)
                if step <= steps_per_epoch:  # the first pass
                    preq += (len(idx), loss * len(idx), acc * len(idx))
                    if hist is not None and half.pred is not None:
                        _count_scores(hist, half.pred, y[idx])
                    preq_losses.append(loss)
                    preq_errors.append(1.0 - acc)
                if step % window == 0 or step == total:
                    with timer("exchange"):
                        half.exchange()
                    timer.exchanges += 1
                    if after_exchange is not None:
                        after_exchange(done + timer.exchanges)
                if ids is not None:
                    with timer("exchange"):
                        ids.arrive()
            with timer("exchange"):
                half.close()
    except ps.ProtocolError as e:
        if e.reason not in ("nonfinite", "range"):
            raise
        # The model diverged, or left float16's range on the wire: the task returns (a retry
        # would compute the same update), and the driver stops the batch before its save
        # with one line.
        last = losses[-1] if losses else float("nan")
        why = (
            f"worker {worker}'s update after {len(losses)} mini-batches was not finite, last loss "
            f"{last:.4g}"
            if e.reason == "nonfinite"
            else f"worker {worker}: {e}"
        )
        return TaskResult(
            worker=worker,
            records=0,
            steps=0,
            exchanges=timer.exchanges,
            loss_first=float("nan"),
            loss_last=last,
            staleness=[],
            compute_s=timer.seconds["compute"],
            exchange_s=timer.seconds["exchange"],
            fresh_replica=fresh,
            task=task,
            attempt=attempt,
            diverged=why,
        )
    head = losses[: min(10, len(losses))] or [float("nan")]
    tail = losses[-min(10, len(losses)) :] or [float("nan")]
    return TaskResult(
        worker=worker,
        records=n * epochs,
        steps=len(losses),
        exchanges=timer.exchanges,
        loss_first=float(np.mean(head)),
        loss_last=float(np.mean(tail)),
        staleness=half.staleness,
        compute_s=timer.seconds["compute"],
        exchange_s=timer.seconds["exchange"],
        fresh_replica=fresh,
        preq_n=int(preq[0]),
        preq_loss=float(preq[1] / preq[0]) if preq[0] else float("nan"),
        preq_acc=float(preq[2] / preq[0]) if preq[0] else float("nan"),
        task=task,
        steps_total=total,
        steps_skipped=skipped,
        repeats=client.repeats,
        attempt=attempt,
        shared_memory=client.shared,
        wire_dtype=client.wire_dtype,
        preq_losses=preq_losses,
        preq_errors=preq_errors,
        preq_hist=hist.tolist() if hist is not None and hist.any() else None,
        **(_row_figures(ids) if ids is not None else {}),
    )


#: Bins of the prequential score histogram (:attr:`TaskResult.preq_hist`).
HIST_BINS = 200


def _count_scores(hist: np.ndarray, pred: np.ndarray, y: np.ndarray) -> None:
    """Add a mini-batch's positive-class scores to ``hist`` by label."""
    pred = np.asarray(pred)
    score = pred[:, -1] if pred.ndim == 2 else pred.reshape(-1)
    bins = np.clip((score * HIST_BINS).astype(np.int64), 0, HIST_BINS - 1)
    labels = np.asarray(y).reshape(-1).astype(np.int64)
    np.add.at(hist, (np.clip(labels, 0, 1), bins), 1)


def hist_auc(hist: np.ndarray | list[list[int]]) -> float | None:
    """The AUC of binned scores (negatives' counts, positives'): ties within a bin count
    half. None without both classes.

    >>> hist_auc([[3, 1, 0], [0, 1, 3]])  # one tie in the middle bin
    0.96875
    """
    neg, pos = (np.asarray(h, np.float64) for h in hist)
    total = neg.sum() * pos.sum()
    if not total:
        return None
    below = np.concatenate([[0.0], np.cumsum(neg)[:-1]])
    return float(((pos * below).sum() + 0.5 * (pos * neg).sum()) / total)


def _row_figures(ids: IdRows) -> dict[str, Any]:
    got = ids.figures()
    return {
        "rows_read": got["rows_read"],
        "rows_pushed": got["rows_pushed"],
        "row_staleness": got["staleness"],
        "rows_s": got["seconds"],
    }


#: How long a task keeps trying to connect to a parameter server that refuses or drops its
#: connection before the handshake (a flood of idle peers, a burst of workers) before it fails.
CONNECT_RETRY_S = 60.0


def _minibatches(rng: np.random.Generator, n: int, batch: int, epochs: int) -> Iterator[np.ndarray]:
    """The indices of each mini-batch, epoch after epoch, each epoch in a new order."""
    for _ in range(epochs):
        order = rng.permutation(n)
        for start in range(0, n, batch):
            yield order[start : start + batch]


class _Timer:
    """Seconds spent per activity, in ``with timer("name"):`` blocks."""

    def __init__(self) -> None:
        self.seconds = {"compute": 0.0, "exchange": 0.0}
        self.exchanges = 0
        self._name = ""

    def __call__(self, name: str) -> _Timer:
        self._name = name
        return self

    def __enter__(self) -> None:
        self._started = time.perf_counter()

    def __exit__(self, *_: object) -> None:
        self.seconds[self._name] += time.perf_counter() - self._started
