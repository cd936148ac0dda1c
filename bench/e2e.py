"""Benchmark: `streamtrain run` against the best single-process Keras, same data, model, batch size.

Arms, in one run:
  1. plain Keras: a ``train_on_batch`` loop (Adam, batch 128, a fresh permutation every
     epoch), scored on the 10,000 test images every 5,000 records (scoring not timed), to
     0.99 or ``--max-epochs``; ``model.fit``'s rate is probed on 20,000 records and the
     faster of the two is the baseline's records/s (its times to accuracy are the loop's
     records at that rate);
  2. `streamtrain run` (embedded broker, Spark local[*], parameter server), its micro-batches
     5,000 records so that it is scored on the same grid (``--eval-every 1``, scoring
     excluded): records/s, records and seconds from the first micro-batch to 0.98, 0.985 and
     0.99; start-up (Spark, worker warm-up, query start) on its own; peak RSS of all its
     processes; where each task slot's time went (pipeline/train/breakdown.py);
  3. HIGGS: ROC AUC on the 500-row test after the same epochs over the 7,000-row sample,
     so at equal records (medians over the seeds);
  4. start-up, cold and warm: seconds from launching `streamtrain run --max-batches 1` to
     its "first micro-batch trained" line. Cold: an empty cache folder (no JVM class
     archive; the MNIST file is linked in, not downloaded), no compiled Python bytecode
     (an empty PYTHONPYCACHEPREFIX, as after a fresh install) and the page cache dropped
     where this process may (root, writable /proc/sys/vm). Warm: the same command again
     with everything a first run leaves behind.
Times and records to accuracy are medians over the seeds (``records_ratio``: plain's
records to 0.985 over streamtrain's, >= 1 when the distributed run needs no more records).

    .venv/bin/python bench/e2e.py [--seeds 3] [--max-epochs 3] [--startup-only]

``ceiling_ratio``: two single-thread replicas computing gradients at once, in two processes
and nothing else around them, over plain Keras's records/s: the throughput ratio's ceiling
on these cores; ``ceiling_share`` is throughput_ratio over it.

Last line: ``e2e throughput_ratio=<r> ceiling_ratio=<r> ceiling_share=<r> tta0985_ratio=<r>
records_ratio=<r> records_098=<plain>/<streamtrain> records_099=<p>/<s> tta098_s=<p>/<s>
tta099_s=<p>/<s> compute_share=<r> startup_s=<s> mnist_acc=<a> higgs_auc=<a>
higgs_auc_delta=<d> peak_rss_gb=<g> startup_cold_s=<s> startup_warm_s=<s>``
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
TARGETS = (0.98, 0.985, 0.99)
TARGET = 0.985  # the one the ratios use
#: Records between held-out scores, in both arms: streamtrain's micro-batch
#: (--max-offsets-per-trigger).
SCORE_EVERY = 5_000


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
    """One plain-Keras arm in this process: samples/s, and records and seconds to each of
    TARGETS (MNIST) or the AUC after ``max_epochs`` (HIGGS). ``mode`` "fit" only measures
    ``model.fit``'s rate on 20,000 records."""
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
    rng = np.random.default_rng(seed)
    if mode == "fit":
        idx = rng.permutation(len(y))[:20_000]
        net.fit(
            x[idx[:256]], y[idx[:256]], batch_size=128, epochs=1, verbose=0
        )  # traced outside the timing
        began = time.perf_counter()
        net.fit(x[idx], y[idx], batch_size=128, epochs=1, verbose=0, shuffle=False)
        return {"samples_per_s": len(idx) / (time.perf_counter() - began), "mode": mode}
    trained_s, samples = 0.0, 0
    reached: dict[str, tuple[int, float]] = {}
    for _ in range(max_epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), SCORE_EVERY):
            idx = order[start : start + SCORE_EVERY]
            began = time.perf_counter()
            for s in range(0, len(idx), 128):
                net.train_on_batch(x[idx[s : s + 128]], y[idx[s : s + 128]])
            trained_s += time.perf_counter() - began
            samples += len(idx)
            if dataset == "mnist":
                acc = float(
                    (net.predict(xt, batch_size=1024, verbose=0).argmax(1) == test.y).mean()
                )
                for t in TARGETS:
                    if acc >= t and str(t) not in reached:
                        reached[str(t)] = (samples, trained_s)
        if dataset == "mnist" and len(reached) == len(TARGETS):
            break
    out: dict[str, Any] = {"samples_per_s": samples / trained_s, "reached": reached, "mode": mode}
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
    spec = ModelSpec.from_model(
        zoo.mnist_cnn(), optimizer="adam", loss="sparse_categorical_crossentropy"
    )
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
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--arm", "gradients", "0", "0", f"{start:.3f}"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(workers)
    ]
    together = sum(
        json.loads(p.communicate()[0].strip().splitlines()[-1])["records_per_s"] for p in procs
    )
    return alone, together


def streamtrain(
    dataset: str,
    seed: int,
    epochs: int,
    until: float | None,
    algorithm: str | None = None,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One `streamtrain run` in a subprocess, sampling the RSS of its whole process tree."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cmd = [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            "--dataset",
            dataset,
            "--epochs",
            str(epochs),
            "--seed",
            str(seed),
            "--out",
            str(out),
            "--eval-every",
            "1" if until else "1000",
            "--max-offsets-per-trigger",
            str(SCORE_EVERY if until else 20_000),
        ]
        if algorithm:
            # The single-process baseline through the pipeline trains on one worker only.
            cmd += ["--algorithm", algorithm] + (
                ["--workers", "1"] if algorithm == "single" else []
            )
        if until:
            cmd += ["--until-accuracy", str(until)]
        cmd += extra
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
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
    reached: dict[str, tuple[int, float]] = {}
    trained = 0
    for row in report["batches"]:
        trained += row["trained"]
        for t in TARGETS:
            if row.get("heldout", {}).get("accuracy", 0) >= t and str(t) not in reached:
                reached[str(t)] = (trained, row["t_stream"] - row["eval_s_total"])
    return {
        "samples_per_s": report["records_per_s_excluding_eval"],
        "reached": reached,
        "startup_s": report["startup_s"],
        "final": report["final"],
        "peak_rss_gb": peak[0] / 1e9,
        "stopped": report["stopped_because"],
        "shares": report.get("time_shares", {}),
        "exchange_parts": report.get("exchange_parts", {}),
    }


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
        # A small first batch: the line comes when the batch is trained, and start-up is what is
        # timed.
        cmd = [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            "--max-batches",
            "1",
            "--max-offsets-per-trigger",
            "1000",
            "--out",
            str(Path(tmp) / "run"),
        ]
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        seen = None
        for line in proc.stdout:  # type: ignore[union-attr]
            if seen is None and "first micro-batch trained" in line:
                seen = time.monotonic() - started
        _, err = proc.communicate()
        if proc.returncode != 0 or seen is None:
            raise SystemExit(
                f"streamtrain run --max-batches 1 failed: {err.strip().splitlines()[-1:]}"
            )
        return seen


def startup_cold_and_warm() -> tuple[float, float, bool]:
    """(cold, warm, whether the page cache was dropped for the cold one)."""
    from startup import await_class_archive, fresh_caches  # a sibling benchmark

    with fresh_caches() as (env, cache):
        dropped = _drop_page_cache()
        cold = first_batch_s(env)
        await_class_archive(cache)
        warm = first_batch_s(env)
    print(
        f"start-up: cold {cold:.1f} s (page cache {'dropped' if dropped else 'kept: not root'}), "
        f"warm {warm:.1f} s",
        flush=True,
    )
    return cold, warm, dropped


def in_child(script: str, *args: str) -> dict[str, Any]:
    """Run ``script --arm ARGS`` in a fresh process (TensorFlow state and threads start
    clean); return the JSON of its last line."""
    done = subprocess.run(
        [sys.executable, script, "--arm", *args], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _in_child(*args: str) -> dict[str, Any]:
    """A plain-Keras arm of this benchmark in a fresh process."""
    return in_child(__file__, *args)


INF = (float("inf"), float("inf"))


def _at(reached: dict[str, Any], target: float) -> tuple[float, float]:
    """(records, seconds) to ``target``, inf where it was not reached."""
    got = reached.get(str(target))
    return (float(got[0]), float(got[1])) if got else INF


def _median(pairs: list[tuple[float, float]], i: int) -> float:
    return statistics.median(p[i] for p in pairs)


def _fmt(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.0f}"


def compare(algorithms: list[str], seeds: int, max_epochs: int) -> None:
    """Records and seconds to each accuracy for each algorithm through the whole pipeline,
    on the 5,000-record grid (docs/performance.md's table; the run's default should be the best)."""
    got: dict[str, dict[float, list[tuple[float, float]]]] = {
        a: {t: [] for t in TARGETS} for a in algorithms
    }
    rates: dict[str, list[float]] = {a: [] for a in algorithms}
    finals: dict[str, list[float]] = {a: [] for a in algorithms}
    for seed in range(seeds):
        for algo in algorithms:
            name, *extra = algo.split("+")  # sync+overlap: --sync-overlap
            st = streamtrain(
                "mnist",
                seed,
                max_epochs,
                TARGETS[-1],
                algorithm=name,
                extra=tuple(f"--sync-{e}" for e in extra),
            )
            for t in TARGETS:
                got[algo][t].append(_at(st["reached"], t))
            rates[algo].append(st["samples_per_s"])
            finals[algo].append(st["final"]["accuracy"])
            print(
                f"seed {seed} {algo}: reached {st['reached']} samples/s {st['samples_per_s']:.0f} "
                f"final {st['final']} compute share {st['shares'].get('compute')}",
                flush=True,
            )
    print(
        "| algorithm | "
        + " | ".join(f"records to {t}" for t in TARGETS)
        + " | seconds to 0.985 | records/s |"
    )
    for a in algorithms:
        print(
            f"| {a} | "
            + " | ".join(_fmt(_median(got[a][t], 0)) for t in TARGETS)
            + f" | {_fmt(_median(got[a][TARGET], 1))} | {statistics.median(rates[a]):.0f} |"
        )
    print(
        "algorithms "
        + " ".join(
            f"{a}_records_0985={_fmt(_median(got[a][TARGET], 0))} "
            f"{a}_acc={statistics.median(finals[a]):.4f}"
            for a in algorithms
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-epochs", type=int, default=3)
    ap.add_argument("--higgs-epochs", type=int, default=5)
    ap.add_argument(
        "--compare",
        metavar="ALGOS",
        help="only the streamtrain arm: time to 0.985 for each comma-separated algorithm",
    )
    ap.add_argument(
        "--startup-only", action="store_true", help="only the cold and warm start-up arm"
    )
    ap.add_argument(
        "--arm", nargs=4, metavar=("DATASET", "SEED", "EPOCHS", "MODE"), help=argparse.SUPPRESS
    )
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

    plain_at: dict[float, list[tuple[float, float]]] = {t: [] for t in TARGETS}
    stream_at: dict[float, list[tuple[float, float]]] = {t: [] for t in TARGETS}
    plain_sps, stream_sps, startups, rss, accs, compute = [], [], [], [], [], []
    for seed in range(args.seeds):
        fit = _in_child("mnist", str(seed), "1", "fit")
        loop = _in_child("mnist", str(seed), str(args.max_epochs), "loop")
        best = max(fit["samples_per_s"], loop["samples_per_s"])
        st = streamtrain("mnist", seed, args.max_epochs, TARGETS[-1])
        for t in TARGETS:
            records, _ = _at(loop["reached"], t)
            plain_at[t].append(
                (records, records / best)
            )  # the loop's records at the best mode's rate
            stream_at[t].append(_at(st["reached"], t))
        print(
            f"seed {seed}: plain Keras fit {fit['samples_per_s']:.0f}/s, loop "
            f"{loop['samples_per_s']:.0f}/s reached {loop['reached']}; streamtrain "
            f"{st['samples_per_s']:.0f}/s reached {st['reached']} start-up {st['startup_s']:.1f} "
            f"s final {st['final']} peak RSS {st['peak_rss_gb']:.2f} GB ({st['stopped']})",
            flush=True,
        )
        print(
            "  time shares: "
            + " ".join(f"{k} {v:.2f}" for k, v in st["shares"].items())
            + (
                "; of the exchange: "
                + " ".join(f"{k} {v:.2f}" for k, v in st["exchange_parts"].items())
                if st["exchange_parts"]
                else ""
            ),
            flush=True,
        )
        compute.append(st["shares"].get("compute", 0.0))
        plain_sps.append(best)
        stream_sps.append(st["samples_per_s"])
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
        print(
            f"higgs seed {seed}: plain Keras AUC {higgs_plain['auc']:.4f}; streamtrain AUC "
            f"{higgs_stream['final']['auc']:.4f} after {args.higgs_epochs} epochs",
            flush=True,
        )
    # What two workers can compute at once on these cores, whatever the pipeline around them.
    alone, together = parallel_ceiling(2)
    print(
        f"gradients of one single-thread replica: {alone:.0f} records/s alone, {together:.0f}/s "
        f"for two at once; plain Keras's best {statistics.median(plain_sps):.0f}/s",
        flush=True,
    )
    throughput = statistics.median(stream_sps) / statistics.median(plain_sps)
    ceiling = together / statistics.median(plain_sps)
    tta_ratio = _median(plain_at[TARGET], 1) / _median(stream_at[TARGET], 1)
    records_ratio = _median(plain_at[TARGET], 0) / _median(stream_at[TARGET], 0)
    print("| | " + " | ".join(f"records to {t} | seconds to {t}" for t in TARGETS) + " |")
    for name, at in (("plain Keras", plain_at), ("streamtrain", stream_at)):
        print(
            f"| {name} | "
            + " | ".join(f"{_fmt(_median(at[t], 0))} | {_median(at[t], 1):.1f}" for t in TARGETS)
            + " |"
        )
    pairs = " ".join(
        f"records_{str(t).replace('.', '')}="
        f"{_fmt(_median(plain_at[t], 0))}/{_fmt(_median(stream_at[t], 0))} "
        f"tta{str(t).replace('.', '')}_s="
        f"{_median(plain_at[t], 1):.1f}/{_median(stream_at[t], 1):.1f}"
        for t in (0.98, 0.99)
    )
    print(
        f"e2e throughput_ratio={throughput:.2f} ceiling_ratio={ceiling:.2f} "
        f"ceiling_share={throughput / ceiling:.2f} tta0985_ratio={tta_ratio:.2f} "
        f"records_ratio={records_ratio:.2f} {pairs} "
        f"compute_share={statistics.median(compute):.2f} "
        f"startup_s={statistics.median(startups):.1f} mnist_acc={statistics.median(accs):.4f} "
        f"higgs_auc={statistics.median(stream_auc):.4f} "
        f"higgs_auc_delta={statistics.median(stream_auc) - statistics.median(plain_auc):+.4f} "
        f"peak_rss_gb={max(rss):.2f} startup_cold_s={cold:.1f} startup_warm_s={warm:.1f}"
    )


if __name__ == "__main__":
    main()
