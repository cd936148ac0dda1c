"""Benchmark: how long `streamtrain run` takes to train its first micro-batch, and its memory,
against the floor its parts set, all measured in one run.

The parts, each timed in a fresh process: ``import tensorflow`` plus building the MNIST
CNN and tracing its training step (what every worker needs), a bare SparkSession start,
and the embedded broker's start. floor_s is the largest of them: what perfect overlap of
everything else would cost. Then `streamtrain run --max-batches 1`, from launch to its
"first micro-batch trained" line: cold (an empty cache folder, no compiled bytecode, the
page cache dropped where allowed) and warm (the same again). Memory: the peak, over the
warm run, of the sum over every process of the run of PSS (``/proc/<pid>/smaps_rollup``:
shared pages divided among the processes sharing them) and of RSS (shared pages counted
once per process).

Apache Kafka's own broker (``--engine kafka``), each start in a fresh process until it
answers a metadata request: cold (its jars in the cache, but no formatted data folder to copy
and the page cache dropped where allowed) and warm (the median of the next three), beside
Tansu's warm start, the default engine's.

    .venv/bin/python bench/startup.py [--repeat 3] [--broker-only]

Last line: ``startup cold_s=<s> warm_s=<s> floor_s=<s> warm_ratio_vs_floor=<r>
peak_pss_gb=<g> peak_rss_gb=<g> kafka_cold_s=<s> kafka_warm_s=<s> tansu_warm_s=<s>``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e import _drop_page_cache, descendants  # noqa: E402  (a sibling benchmark)

ROOT = Path(__file__).resolve().parent.parent

PARTS = {
    "tensorflow": """
import time; t = time.perf_counter()
import numpy as np
from pipeline.train import zoo
from pipeline.train.replica import init_tensorflow
init_tensorflow(1)
model = zoo.mnist_cnn()
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.train_on_batch(np.zeros((64, 28, 28, 1), np.float32), np.zeros(64, np.int32))
print(time.perf_counter() - t)
""",
    "spark": """
import time; t = time.perf_counter()
from pipeline import cluster
s = cluster.session("local[2]", app="startup-floor")
s.sparkContext.parallelize([1]).count()
took = time.perf_counter() - t
import os  # the JVM is not a child this process waits for: its CPU is read here
stat = open(f"/proc/{s.sparkContext._gateway.proc.pid}/stat").read().rsplit(")", 1)[1].split()
print(took, (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK"))
cluster.stop(s)
""",
    "broker": """
import time; t = time.perf_counter()
from pipeline.ingest.kafka import EmbeddedBroker
b = EmbeddedBroker().start()
print(time.perf_counter() - t)
b.stop()
""",
}


KAFKA_START = """
import time; t = time.perf_counter()
from pipeline.ingest.kafka import EmbeddedBroker
b = EmbeddedBroker(engine="{engine}").start()
print(time.perf_counter() - t)
b.stop()
"""


def broker_starts(repeat: int) -> tuple[float, float, float]:
    """Apache Kafka's cold and warm start (seconds to a metadata answer), and Tansu's warm."""
    import shutil

    from pipeline.ingest.kafka import engines

    engines.kafka_classpath(quiet=False)  # the jars: a download, not a start
    shutil.rmtree(engines.kafka_template_folder(), ignore_errors=True)
    _drop_page_cache()
    cold = part_s(KAFKA_START.format(engine="kafka"))[0]
    warm = statistics.median(part_s(KAFKA_START.format(engine="kafka"))[0] for _ in range(repeat))
    tansu = statistics.median(part_s(KAFKA_START.format(engine="tansu"))[0] for _ in range(repeat))
    print(f"brokers: kafka cold {cold:.1f} s, warm {warm:.1f} s; tansu warm {tansu:.2f} s")
    return cold, warm, tansu


def part_s(code: str) -> tuple[float, float]:
    """Seconds the part took in a fresh process, and the CPU seconds that process and the
    children it waited for used (user and system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    said = [float(x) for x in done.stdout.strip().splitlines()[-1].split()]
    return said[0], cpu + sum(said[1:])  # a part may add the CPU of a process it did not wait for


def memory_bytes(root: int) -> tuple[int, int]:
    """(PSS, RSS) summed over ``root`` and its descendants."""
    pss = rss = 0
    for pid in descendants(root):
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
                elif line.startswith("Rss:"):
                    rss += int(line.split()[1]) * 1024
        except OSError:
            pass
    return pss, rss


@contextlib.contextmanager
def fresh_caches() -> Iterator[tuple[dict[str, str], Path]]:
    """The environment of a first run on a fresh install, and its cache folder: an empty
    cache (the MNIST file linked in: data is not start-up) and compiled bytecode in an
    empty prefix (the first run compiles and writes it there, later runs read it)."""
    from pipeline import config

    real_cache = config.cache_dir()
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as pyc:
        if (real_cache / "mnist.npz").exists():
            os.symlink(real_cache / "mnist.npz", Path(cache) / "mnist.npz")
        if (real_cache / "jars").is_dir():  # Kafka's jars: a download, not start-up
            os.symlink(real_cache / "jars", Path(cache) / "jars")
        yield (
            {
                **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
                "STREAMTRAIN_CACHE_DIR": cache,
                "PYTHONPYCACHEPREFIX": pyc,
            },
            Path(cache),
        )


def await_class_archive(cache: Path, timeout_s: float = 600) -> bool:
    """Wait until the class archive a first run leaves to build in the background is built
    (it runs at the lowest priority, but a warm run measured beside it would pay for it)."""
    deadline = time.monotonic() + timeout_s
    folder = cache / "jvm"
    while time.monotonic() < deadline:
        if list(folder.glob("*.jsa")) and not list(folder.glob("*.part")):
            return True
        time.sleep(1)
    return False


def run_once(env: dict[str, str], *, sample: bool = False) -> tuple[float, int, int]:
    """Seconds from launch to the first trained micro-batch; with ``sample``, the peak PSS
    and RSS of the run (reading every process's page tables twice a second costs CPU the
    start-up would have had: timed runs do not sample)."""
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
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        peak = [0, 0]

        def sampler_loop() -> None:
            while sample and proc.poll() is None:
                pss, rss = memory_bytes(proc.pid)
                peak[0], peak[1] = max(peak[0], pss), max(peak[1], rss)
                time.sleep(0.5)

        sampler = threading.Thread(target=sampler_loop, daemon=True)
        sampler.start()
        seen = None
        for line in proc.stdout:  # type: ignore[union-attr]
            if seen is None and "first micro-batch trained" in line:
                seen = time.monotonic() - started
        proc.wait()
        sampler.join()
        if proc.returncode != 0 or seen is None:
            raise SystemExit(f"streamtrain run --max-batches 1 failed (exit {proc.returncode})")
        return seen, peak[0], peak[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="warm runs (the median is reported)")
    ap.add_argument(
        "--broker-only", action="store_true", help="time the brokers' starts alone, then stop"
    )
    args = ap.parse_args()
    kafka_cold, kafka_warm, tansu_warm = broker_starts(args.repeat)
    if args.broker_only:
        print(
            f"startup kafka_cold_s={kafka_cold:.1f} kafka_warm_s={kafka_warm:.1f} "
            f"tansu_warm_s={tansu_warm:.2f}"
        )
        return

    timed = {name: [part_s(code) for _ in range(2)] for name, code in PARTS.items()}
    parts = {name: statistics.median(s for s, _ in runs) for name, runs in timed.items()}
    cpu = {name: statistics.median(c for _, c in runs) for name, runs in timed.items()}
    print(
        "parts: "
        + " ".join(f"{k}={v:.1f}s" for k, v in parts.items())
        + " (CPU, whole processes: "
        + " ".join(f"{k}={v:.1f}s" for k, v in cpu.items())
        + ")",
        flush=True,
    )
    floor = max(parts.values())

    with fresh_caches() as (env, cache):
        dropped = _drop_page_cache()
        cold, _, _ = run_once(env)
        print(
            f"cold: {cold:.1f} s (page cache {'dropped' if dropped else 'kept: not allowed here'})",
            flush=True,
        )
        if not await_class_archive(Path(cache)):
            print(
                "the class archive was not built within 10 minutes: warm runs start without it",
                flush=True,
            )
        warm_runs = [run_once(env)[0] for _ in range(args.repeat)]
        print("warm: " + ", ".join(f"{s:.1f} s" for s in warm_runs), flush=True)
        _, pss, rss = run_once(env, sample=True)
        print(
            f"memory (one more warm run): peak PSS {pss / 1e9:.2f} GB, peak RSS {rss / 1e9:.2f} GB",
            flush=True,
        )
        # What the zygote saves: the same warm run with every process importing its own.
        unshared = run_once({**env, "STREAMTRAIN_PRELOAD": "false"})
        _, unshared_pss, _ = run_once({**env, "STREAMTRAIN_PRELOAD": "false"}, sample=True)
        print(
            f"warm without the zygote: {unshared[0]:.1f} s, peak PSS {unshared_pss / 1e9:.2f} GB",
            flush=True,
        )
    warm = statistics.median(warm_runs)
    print(
        json.dumps(
            {
                "parts": parts,
                "parts_cpu_s": cpu,
                "cores": os.cpu_count(),
                "cold": cold,
                "warm": warm_runs,
                "warm_without_zygote": unshared[0],
                "pss_without_zygote_gb": round(unshared_pss / 1e9, 2),
            }
        )
    )
    print(
        f"startup cold_s={cold:.1f} warm_s={warm:.1f} floor_s={floor:.1f} "
        f"warm_ratio_vs_floor={warm / floor:.2f} peak_pss_gb={pss / 1e9:.2f} "
        f"peak_rss_gb={rss / 1e9:.2f} kafka_cold_s={kafka_cold:.1f} "
        f"kafka_warm_s={kafka_warm:.1f} tansu_warm_s={tansu_warm:.2f}"
    )


if __name__ == "__main__":
    main()
