"""Benchmark: `streamtrain run` against the best single-process Keras, same data, model, batch size.

Arms, in one run:
  1. plain Keras: the faster of `model.fit` and a `train_on_batch` loop (Adam, batch 128),
     samples/s and wall time to 0.985 MNIST test accuracy (scored every 20,000 records,
     where streamtrain's micro-batches end; scoring time excluded);
  2. `streamtrain run` (embedded broker, Spark local[*], parameter server): samples/s and
     wall time to 0.985 from the first micro-batch (held-out scoring after every batch of
     20,000 records, excluded), start-up (Spark, worker warm-up, query start) reported on
     its own; peak RSS of all its processes; where each task slot's time went
     (pipeline/train/breakdown.py: compute, exchange, read and decode, ..., between batches);
  3. HIGGS: ROC AUC on the 500-row test after the same epochs over the 7,000-row sample
     (medians over the seeds);
  4. start-up, cold and warm: seconds from launching `streamtrain run --max-batches 1` to
     its "first micro-batch trained" line. Cold: an empty cache folder (no JVM class
     archive; the MNIST file is linked in, not downloaded), no compiled Python bytecode
     (an empty PYTHONPYCACHEPREFIX, as after a fresh install) and the page cache dropped
     where this process may (root, writable /proc/sys/vm). Warm: the same command again
     with everything a first run leaves behind.
Time to accuracy is the median over the seeds, and so are the records each arm trained
to reach it (``records_ratio``: plain's over streamtrain's, >= 1 when the distributed run
needs no more records).

    .venv/bin/python bench/e2e.py [--seeds 3] [--max-epochs 4] [--startup-only]

``ceiling_ratio``: two single-thread replicas computing gradients at once, in two processes
and nothing else around them, over plain Keras's records/s: the throughput ratio's ceiling
on these cores.

Last line: ``e2e throughput_ratio=<r> tta0985_ratio=<r> records_ratio=<r> compute_share=<r> ceiling_ratio=<r> startup_s=<s>
mnist_acc=<a> higgs_auc=<a> higgs_auc_delta=<d> peak_rss_gb=<g> startup_cold_s=<s> startup_warm_s=<s>``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TARGET = 0.985
#: Records between held-out scores, in both arms: streamtrain's micro-batch (--max-offsets-per-trigger).
SCORE_EVERY = 20_000


def descendants(root: int) -> list[int]:
    """``root`` and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _tree_rss_bytes(root: int) -> int:
    """RSS of ``root`` and all its descendants, from /proc."""
    total = 0
    for pid in descendants(root):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def plain_keras(dataset: str, seed: int, max_epochs: int, mode: str) -> dict[str, Any]:
    """One plain-Keras arm in this process: samples/s and time to TARGET (MNIST) or AUC (HIGGS)."""
    import keras

    from pipeline.train import zoo
    from pipeline.train.evaluation import roc_auc
    from producers import datasets

    keras.utils.set_random_seed(seed)
    data = datasets.get(dataset)
    train, test = data.load("train"), data.load("test")
    x, y = data.schema.to_model_input(train.x), train.y
    xt = data.schema.to_model_input(test.x)
    net = zoo.mnist_cnn() if dataset == "mnist" else zoo.higgs_mlp()
    net.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    trained_s, samples, tta, rta = 0.0, 0, None, None
    rng = np.random.default_rng(seed)
    for _ in range(max_epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), SCORE_EVERY):
            idx = order[start : start + SCORE_EVERY]
            began = time.perf_counter()
            if mode == "fit":
                net.fit(x[idx], y[idx], batch_size=128, epochs=1, verbose=0, shuffle=False)
            else:
                for s in range(0, len(idx), 128):
                    net.train_on_batch(x[idx[s : s + 128]], y[idx[s : s + 128]])
            trained_s += time.perf_counter() - began
            samples += len(idx)
            if dataset == "mnist" and tta is None:
                acc = float((net.predict(xt, batch_size=1024, verbose=0).argmax(1) == test.y).mean())
                if acc >= TARGET:
                    tta, rta = trained_s, samples
        if dataset == "mnist" and tta is not None:
            break
    out: dict[str, Any] = {"samples_per_s": samples / trained_s, "tta_s": tta, "records_to_target": rta, "mode": mode}
    probs = net.predict(xt, batch_size=1024, verbose=0)
    out["accuracy"] = float((probs.argmax(1) == test.y).mean())
    if dataset == "higgs":
        out["auc"] = roc_auc(test.y, probs[:, 1])
    return out


def gradient_rate(start_at: float, batch: int = 64, steps: int = 60) -> dict[str, Any]:
    """Records/s of one single-thread replica computing the MNIST CNN's gradients (a
    streamtrain worker's compute, nothing else), from ``start_at`` (``time.time()``), so
    that several of these run at once."""
    from pipeline.train import zoo
    from pipeline.train.model import ModelSpec
    from pipeline.train.replica import replica
    from producers import datasets

    data = datasets.get("mnist")
    train = data.load("train")
    x = data.schema.to_model_input(train.x[: batch * steps]).reshape(-1, 28, 28, 1)
    y = train.y[: batch * steps].astype(np.int32)
    spec = ModelSpec.from_model(zoo.mnist_cnn(), optimizer="adam", loss="sparse_categorical_crossentropy")
    entry, _ = replica(spec, job="bench", threads=1)
    for _ in range(3):
        entry.gradients(x[:batch], y[:batch])
    time.sleep(max(0.0, start_at - time.time()))
    began = time.perf_counter()
    for i in range(steps):
        entry.gradients(x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch])
    return {"records_per_s": batch * steps / (time.perf_counter() - began)}


def parallel_ceiling(workers: int) -> tuple[float, float]:
    """Records/s of one single-thread replica's gradients alone, and of ``workers`` of them
    at once, each in its own process (the most the run's workers can compute together here)."""
    alone = _in_child("gradients", "0", "0", f"{time.time() + 15:.3f}")["records_per_s"]
    start = time.time() + 20  # every child imports TensorFlow and traces before the start
    procs = [subprocess.Popen([sys.executable, __file__, "--arm", "gradients", "0", "0", f"{start:.3f}"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for _ in range(workers)]
    together = sum(json.loads(p.communicate()[0].strip().splitlines()[-1])["records_per_s"] for p in procs)
    return alone, together


def streamtrain(dataset: str, seed: int, epochs: int, until: float | None, algorithm: str | None = None) -> dict[str, Any]:
    """One `streamtrain run` in a subprocess, sampling the RSS of its whole process tree."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "pipeline", "run", "--dataset", dataset, "--epochs", str(epochs),
               "--seed", str(seed), "--out", str(out), "--eval-every", "1" if until else "1000",
               "--max-offsets-per-trigger", str(SCORE_EVERY)]
        if algorithm:
            # The single-process baseline through the pipeline trains on one worker only.
            cmd += ["--algorithm", algorithm] + (["--workers", "1"] if algorithm == "single" else [])
        if until:
            cmd += ["--until-accuracy", str(until)]
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        peak = [0]

        def sample() -> None:
            while proc.poll() is None:
                peak[0] = max(peak[0], _tree_rss_bytes(proc.pid))
                time.sleep(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, err = proc.communicate()
        sampler.join()
        if proc.returncode != 0:
            raise SystemExit(f"streamtrain run failed: {err.strip().splitlines()[-1:]}")
        report = json.loads((out / "report.json").read_text())
    tta, rta, trained = None, None, 0
    for row in report["batches"]:
        trained += row["trained"]
        if row.get("heldout", {}).get("accuracy", 0) >= TARGET:
            tta, rta = row["t_stream"] - row["eval_s_total"], trained
            break
    return {"samples_per_s": report["records_per_s_excluding_eval"], "tta_s": tta, "records_to_target": rta,
            "startup_s": report["startup_s"], "final": report["final"], "peak_rss_gb": peak[0] / 1e9,
            "stopped": report["stopped_because"], "shares": report.get("time_shares", {})}


def _drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def first_batch_s(env: dict[str, str]) -> float:
    """Seconds from launching a one-batch MNIST run to its first trained micro-batch."""
    with tempfile.TemporaryDirectory() as tmp:
        # A small first batch: the line comes when the batch is trained, and start-up is what is timed.
        cmd = [sys.executable, "-m", "pipeline", "run", "--max-batches", "1", "--max-offsets-per-trigger", "1000",
               "--out", str(Path(tmp) / "run")]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = None
        for line in proc.stdout:  # type: ignore[union-attr]
            if seen is None and "first micro-batch trained" in line:
                seen = time.monotonic() - started
        _, err = proc.communicate()
        if proc.returncode != 0 or seen is None:
            raise SystemExit(f"streamtrain run --max-batches 1 failed: {err.strip().splitlines()[-1:]}")
        return seen


def startup_cold_and_warm() -> tuple[float, float, bool]:
    """(cold, warm, whether the page cache was dropped for the cold one)."""
    from startup import await_class_archive, fresh_caches  # a sibling benchmark

    with fresh_caches() as (env, cache):
        dropped = _drop_page_cache()
        cold = first_batch_s(env)
        await_class_archive(cache)
        warm = first_batch_s(env)
    print(f"start-up: cold {cold:.1f} s (page cache {'dropped' if dropped else 'kept: not root'}), "
          f"warm {warm:.1f} s", flush=True)
    return cold, warm, dropped


def _in_child(*args: str) -> dict[str, Any]:
    """Run a plain-Keras arm in a fresh process (TensorFlow state and threads start clean)."""
    done = subprocess.run([sys.executable, __file__, "--arm", *args], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def compare(algorithms: list[str], seeds: int, max_epochs: int) -> None:
    """Which algorithm reaches 0.985 soonest through the whole pipeline (the run's default
    should be that one)."""
    ttas: dict[str, list[float]] = {a: [] for a in algorithms}
    finals: dict[str, list[float]] = {a: [] for a in algorithms}
    for seed in range(seeds):
        for algo in algorithms:
            st = streamtrain("mnist", seed, max_epochs, TARGET, algorithm=algo)
            ttas[algo].append(st["tta_s"] if st["tta_s"] is not None else float("inf"))
            finals[algo].append(st["final"]["accuracy"])
            print(f"seed {seed} {algo}: tta {st['tta_s']} records {st['records_to_target']} samples/s "
                  f"{st['samples_per_s']:.0f} final {st['final']} compute share {st['shares'].get('compute')}",
                  flush=True)
    print("algorithms " + " ".join(f"{a}_tta_s={statistics.median(t):.1f} {a}_acc={statistics.median(finals[a]):.4f}"
                                   for a, t in ttas.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-epochs", type=int, default=4)
    ap.add_argument("--higgs-epochs", type=int, default=5)
    ap.add_argument("--compare", metavar="ALGOS",
                    help="only the streamtrain arm: time to 0.985 for each comma-separated algorithm")
    ap.add_argument("--startup-only", action="store_true", help="only the cold and warm start-up arm")
    ap.add_argument("--arm", nargs=4, metavar=("DATASET", "SEED", "EPOCHS", "MODE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.arm:
        dataset, seed, epochs, mode = args.arm
        if dataset == "gradients":
            print(json.dumps(gradient_rate(float(mode))))
            return
        print(json.dumps(plain_keras(dataset, int(seed), int(epochs), mode)))
        return

    if args.compare:
        compare(args.compare.split(","), args.seeds, args.max_epochs)
        return
    cold, warm, _ = startup_cold_and_warm()
    if args.startup_only:
        print(f"e2e startup_cold_s={cold:.1f} startup_warm_s={warm:.1f}")
        return

    plain_tta, stream_tta, plain_sps, stream_sps, startups, rss, accs = [], [], [], [], [], [], []
    plain_rta, stream_rta, compute = [], [], []
    for seed in range(args.seeds):
        arms = [_in_child("mnist", str(seed), str(args.max_epochs), m) for m in ("fit", "loop")]
        best = max(arms, key=lambda a: a["samples_per_s"])
        ttas = [a["tta_s"] for a in arms if a["tta_s"] is not None]
        st = streamtrain("mnist", seed, args.max_epochs, TARGET)
        print(f"seed {seed}: plain Keras fit {arms[0]['samples_per_s']:.0f}/s tta {arms[0]['tta_s']}, "
              f"loop {arms[1]['samples_per_s']:.0f}/s tta {arms[1]['tta_s']}; streamtrain {st['samples_per_s']:.0f}/s "
              f"tta {st['tta_s']} start-up {st['startup_s']:.1f} s final {st['final']} peak RSS "
              f"{st['peak_rss_gb']:.2f} GB ({st['stopped']})", flush=True)
        print("  time shares: " + " ".join(f"{k} {v:.2f}" for k, v in st["shares"].items()), flush=True)
        rtas = [a["records_to_target"] for a in arms if a["records_to_target"] is not None]
        plain_rta.append(min(rtas) if rtas else float("inf"))
        stream_rta.append(st["records_to_target"] or float("inf"))
        compute.append(st["shares"].get("compute", 0.0))
        plain_sps.append(best["samples_per_s"])
        stream_sps.append(st["samples_per_s"])
        plain_tta.append(min(ttas) if ttas else float("inf"))
        stream_tta.append(st["tta_s"] if st["tta_s"] is not None else float("inf"))
        startups.append(st["startup_s"])
        rss.append(st["peak_rss_gb"])
        accs.append(st["final"]["accuracy"])

    # HIGGS AUC after a few epochs of 7,000 rows swings by a few hundredths between runs
    # (of either arm): compare medians over the seeds.
    plain_auc, stream_auc = [], []
    for seed in range(args.seeds):
        higgs_plain = _in_child("higgs", str(seed), str(args.higgs_epochs), "loop")
        higgs_stream = streamtrain("higgs", seed, args.higgs_epochs, None)
        rss.append(higgs_stream["peak_rss_gb"])
        plain_auc.append(higgs_plain["auc"])
        stream_auc.append(higgs_stream["final"]["auc"])
        print(f"higgs seed {seed}: plain Keras AUC {higgs_plain['auc']:.4f}; streamtrain AUC "
              f"{higgs_stream['final']['auc']:.4f} after {args.higgs_epochs} epochs", flush=True)
    # What two workers can compute at once on these cores, whatever the pipeline around them.
    alone, together = parallel_ceiling(2)
    print(f"gradients of one single-thread replica: {alone:.0f} records/s alone, {together:.0f}/s for two at once; "
          f"plain Keras's best {statistics.median(plain_sps):.0f}/s", flush=True)
    throughput = statistics.median(stream_sps) / statistics.median(plain_sps)
    tta_ratio = statistics.median(plain_tta) / statistics.median(stream_tta)
    records_ratio = statistics.median(plain_rta) / statistics.median(stream_rta)
    print(f"e2e throughput_ratio={throughput:.2f} tta0985_ratio={tta_ratio:.2f} records_ratio={records_ratio:.2f} "
          f"compute_share={statistics.median(compute):.2f} ceiling_ratio={together / statistics.median(plain_sps):.2f} "
          f"startup_s={statistics.median(startups):.1f} "
          f"mnist_acc={statistics.median(accs):.4f} higgs_auc={statistics.median(stream_auc):.4f} "
          f"higgs_auc_delta={statistics.median(stream_auc) - statistics.median(plain_auc):+.4f} "
          f"peak_rss_gb={max(rss):.2f} startup_cold_s={cold:.1f} startup_warm_s={warm:.1f}")


if __name__ == "__main__":
    main()
