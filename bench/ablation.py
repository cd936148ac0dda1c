"""Benchmark: where the distributed run's records go, by ablation, in one process per arm.

Every arm trains dist-keras's MNIST CNN (batch 128 per step, Adam 1e-3) from the same
initial weights per seed and is scored on the 10,000 test images every 5,000 records
(scoring not timed: records are what is compared). Arms, each one change from the one
before it:

  plain        Keras's ``train_on_batch`` loop, a fresh permutation of the 60,000 records
               every epoch (what ``model.fit`` does);
  stream       the same loop, fed in the order streamtrain's replicas see the records:
               the replay's order cut into micro-batches of 20,000, split into 2 partitions
               by id, each partition's block shuffled, each step 64 records of each;
  adam_reset   ``stream`` with the optimizer's state zeroed at every micro-batch (what a
               replica rebuilt or reset between tasks does with its own optimizer);
  numpy_adam   ``stream``, but the gradients applied by the parameter server's NumPy Adam
               (:mod:`pipeline.train.algorithms.optimizers`) instead of Keras's;
  sync_stale   ``numpy_adam`` with each step's gradient computed on the weights of the step
               before (synchronous SGD with its push in flight while the next computes);
  sync_dc      ``sync_stale`` with the late gradient delay-compensated on the server
               (DC-ASGD's adaptive rule: g + lambda0 g*g*(w_now - w_then) / sqrt(v));
  sync_predict ``sync_stale`` with the gradient computed on the weights the late step will
               meet, predicted: the weights of the step before plus that step's own update
               (``--sync-overlap``'s replicas do this).

Beside them, the NumPy Adam's largest difference from Keras's after 200 steps on the same
gradients (``adam_max_abs_diff``, relative to the weights' scale).

    .venv/bin/python bench/ablation.py [--seeds 3] [--arms plain,stream,...] [--max-epochs 3]

Last line: ``ablation plain_records=<n> stream_records=<n> ... adam_max_abs_diff=<x>``: the
median records each arm needed to reach 0.985 (``inf`` where it did not in ``--max-epochs``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
ARMS = ("plain", "stream", "adam_reset", "numpy_adam", "sync_stale", "sync_dc", "sync_predict")
#: DC-ASGD-a's lambda_0 (Zheng et al. 2017): the compensation's strength.
DC_LAMBDA = 2.0
TARGETS = (0.98, 0.985, 0.99)
SCORE_EVERY = 5_000
BLOCK = 20_000  # streamtrain's micro-batch (--max-offsets-per-trigger)
PARTITIONS = 2
BATCH = 128


def stream_order(n: int, epochs: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Mini-batches of record indices in the order streamtrain's replicas train them.

    Every epoch replays records 0..n-1 in order; partition = id % PARTITIONS; each
    micro-batch holds BLOCK consecutive records; each partition's share of it is
    shuffled; a synchronous round takes BATCH / PARTITIONS records from each partition.

    >>> batches = stream_order(40_000, 1, np.random.default_rng(0))
    >>> len(batches), sorted(set((batches[0] % 2).tolist())), int(batches[0].max()) < BLOCK
    (314, [0, 1], True)
    """
    per = BATCH // PARTITIONS
    out = []
    for _ in range(epochs):
        for lo in range(0, n, BLOCK):
            ids = np.arange(lo, min(n, lo + BLOCK))
            parts = [rng.permutation(ids[ids % PARTITIONS == p]) for p in range(PARTITIONS)]
            steps = max(-(-len(p) // per) for p in parts)
            out += [
                np.concatenate([p[s * per : (s + 1) * per] for p in parts]) for s in range(steps)
            ]
    return out


def plain_order(n: int, epochs: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Mini-batches of a fresh permutation each epoch, as ``model.fit(shuffle=True)``."""
    out = []
    for _ in range(epochs):
        order = rng.permutation(n)
        out += [order[s : s + BATCH] for s in range(0, n, BATCH)]
    return out


def run_arm(arm: str, seed: int, max_epochs: int) -> dict[str, Any]:
    """Train one arm; return the records at which each target accuracy was first reached."""
    import keras

    from pipeline.train import zoo
    from pipeline.train.algorithms.optimizers import Adam
    from pipeline.train.model import FlatGradients, FlatWeights, ModelSpec, reset_optimizer
    from producers import datasets

    keras.utils.set_random_seed(seed)
    data = datasets.get("mnist")
    train, test = data.load("train"), data.load("test")
    x = data.schema.to_model_input(train.x).reshape(-1, 28, 28, 1)
    y = train.y.astype(np.int32)
    xt = data.schema.to_model_input(test.x).reshape(-1, 28, 28, 1)
    spec = ModelSpec.from_model(
        zoo.mnist_cnn(), optimizer="adam", loss="sparse_categorical_crossentropy"
    )
    model = spec.build()
    rng = np.random.default_rng(seed)
    batches = (plain_order if arm == "plain" else stream_order)(len(y), max_epochs, rng)
    gradient_arm = arm in ("numpy_adam", "sync_stale", "sync_dc", "sync_predict")
    if gradient_arm:
        weights, grads = FlatWeights(model, spec.shapes), FlatGradients(model, spec)
        center = weights.get().copy()
        opt = Adam(spec.size)
        previous = center.copy()  # the weights of the step before (sync_stale computes on them)
        older = center.copy()  # the weights of the step before that (sync_predict's last update)
    seen, reached, curve, began = 0, {}, [], time.perf_counter()
    for idx in batches:
        if gradient_arm:
            if arm == "sync_predict":
                weights.set(2 * previous - older)
            elif arm != "numpy_adam":
                weights.set(previous)
            g, _, _ = grads(x[idx], y[idx])
            if arm == "sync_dc":
                g = g + DC_LAMBDA * g * g * (center - previous) / np.sqrt(opt.v + 1e-7)
            if arm != "numpy_adam":
                np.copyto(older, previous)
                np.copyto(previous, center)
            opt.apply(center, g)
            weights.set(center)
        else:
            if arm == "adam_reset" and seen % BLOCK == 0:
                reset_optimizer(model)
            model.train_on_batch(x[idx], y[idx])
        before, seen = seen, seen + len(idx)
        if seen // SCORE_EVERY != before // SCORE_EVERY:
            if gradient_arm:
                weights.set(center)
            acc = float((model.predict(xt, batch_size=1000, verbose=0).argmax(1) == test.y).mean())
            curve.append((seen, acc))
            for t in TARGETS:
                if acc >= t and t not in reached:
                    reached[t] = seen
            if len(reached) == len(TARGETS):
                break
    return {
        "arm": arm,
        "seed": seed,
        "reached": {str(t): reached.get(t) for t in TARGETS},
        "curve": curve,
        "wall_s": time.perf_counter() - began,
    }


def adam_agreement(steps: int = 200) -> float:
    """Largest |NumPy Adam - Keras Adam| over the weights after ``steps`` steps on the same
    gradients, over the weights' largest magnitude (float32 round-off is ~1e-7 per step)."""
    import keras

    rng = np.random.default_rng(0)
    size = 50_000
    start = rng.normal(0, 0.05, size).astype(np.float32)
    var = keras.Variable(start.copy())
    kopt = keras.optimizers.Adam()
    from pipeline.train.algorithms.optimizers import Adam

    ours, mine = Adam(size), start.copy()
    for _ in range(steps):
        g = rng.normal(0, 1e-2, size).astype(np.float32)
        kopt.apply_gradients([(keras.ops.convert_to_tensor(g), var)])
        ours.apply(mine, g)
    theirs = np.asarray(var.numpy())
    return float(np.abs(theirs - mine).max() / np.abs(theirs).max())


def _in_child(*args: str) -> dict[str, Any]:
    """One arm of this benchmark in a fresh process."""
    sys.path.insert(0, str(ROOT / "bench"))
    from e2e import in_child  # a sibling benchmark

    return in_child(__file__, *args)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--max-epochs", type=int, default=3)
    ap.add_argument("--arm", nargs=3, metavar=("ARM", "SEED", "EPOCHS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        arm, seed, epochs = args.arm
        print(
            json.dumps(
                run_arm(arm, int(seed), int(epochs))
                if arm != "adam"
                else {"diff": adam_agreement()}
            )
        )
        return
    arms = args.arms.split(",")
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        raise SystemExit(f"Expected arms among {list(ARMS)}. Received: {unknown}")
    diff = _in_child("adam", "0", "0")["diff"]
    print(
        f"NumPy Adam vs Keras Adam after 200 steps: max relative difference {diff:.2e}", flush=True
    )
    results: dict[str, dict[float, list[float]]] = {a: {t: [] for t in TARGETS} for a in arms}
    for seed in range(args.seeds):
        for arm in arms:
            r = _in_child(arm, str(seed), str(args.max_epochs))
            for t in TARGETS:
                got = r["reached"][str(t)]
                results[arm][t].append(float("inf") if got is None else got)
            print(
                f"seed {seed} {arm}: "
                + " ".join(f"{t}@{r['reached'][str(t)]}" for t in TARGETS)
                + f" ({r['wall_s']:.0f} s) curve {[(n, round(a, 4)) for n, a in r['curve']]}",
                flush=True,
            )
    print("| arm | " + " | ".join(f"records to {t}" for t in TARGETS) + " |")
    for arm in arms:
        print(
            f"| {arm} | "
            + " | ".join(f"{statistics.median(results[arm][t]):,.0f}" for t in TARGETS)
            + " |"
        )
    print(
        "ablation "
        + " ".join(f"{a}_records={statistics.median(results[a][0.985]):.0f}" for a in arms)
        + f" adam_max_abs_diff={diff:.1e}"
    )


if __name__ == "__main__":
    main()
