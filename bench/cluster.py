"""Benchmark: the seeds' job, one epoch of MNIST (60,000 records) with dist-keras's CNN,
on a Spark standalone cluster across hosts against local mode, in one run.

The cluster is three network namespaces on this machine (:mod:`tests.cluster.multihost`):
the driver with Kafka and Spark's master, and two worker hosts with one core each; the
workers reach the parameter server over TCP, Spark's RPC is authenticated and encrypted.
Local mode runs the same job with two workers on shared memory. Both read the epoch from
a topic filled beforehand, so the wall time counts from the first micro-batch to the last.
Then the parameter server's capacity: push+pull round trips of the CNN's 4 MB from 2, 8
and 16 TCP clients (processes) on loopback; and with 16 clients, one server (in this
process, as ``--ps-shards 1`` runs it) against two shard processes (``--ps-shards 2``:
each client exchanges with both at once), measured one after the other in this run.

    sudo .venv/bin/python bench/cluster.py [--records 60000] [--seconds 4] [--straggler-records
    30000] .venv/bin/python bench/cluster.py --shards-only [--seconds 4]    # the shards' figure
    alone sudo .venv/bin/python bench/cluster.py --straggler-only [--straggler-records 30000]

The straggler arm (issue 43): the same namespace cluster (each worker host's Spark processes
pinned to a core of their own) trains the default algorithm twice from two topics of the same
records, once as it is and once with a CPU hog pinned to worker-b's core (bounded by the
run's timeout, stopped by pid), both with ``spark.speculation true`` in the properties file as
docs/cluster.md says; ``straggler_ratio`` is the second run's records/s over the first's, and
``exactly_once`` that each run trained every record once (every task's mini-batches all
counted as applied by the server). The same pair with an asynchronous algorithm (``adag``,
whose workers never wait for each other) gives ``async_ratio``: what the hog leaves of this
machine, whose two cores also run the driver, the parameter server and the broker, so the
hog slows more than worker-b; ``ceiling_share`` is the synchronous ratio over it.

The seeds (dist-keras on Spark, TF 1) took 1,497.9 s for this epoch on a 3-worker Docker
cluster and 723.9 s on 2 hosts x 2 workers; ``seed_speedup`` is that 723.9 s over the
cluster's epoch here. Last line: ``cluster epoch_s=<s> local_epoch_s=<s> ratio_vs_local=<r>
acc=<a> seed_speedup=<x> ps_mbps_16=<n>`` (ratio_vs_local: local mode's epoch time over the
cluster's, so above 1 the cluster is the faster; ps_mbps: weights moved each way, MB/s;
shard_ratio_2: exchanges applied a second with 2 shards over 1, 16 clients;
straggler_ratio=<r> exactly_once=<bool>). With ``--shards-only``: ``ps shards_1_per_s=<n>
shards_2_per_s=<n> shard_ratio_2=<r>``; with ``--straggler-only``: ``cluster
straggler_ratio=<r> async_ratio=<r> ceiling_share=<r> acc=<hog>/<even> even_rps=<n> hog_rps=<n>
short_rounds=<n> speculative=<n> exactly_once=<bool>``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from ps import WEIGHTS, pushes_per_s  # noqa: E402

from pipeline.ingest.kafka import EmbeddedBroker  # noqa: E402
from pipeline.train import algorithms  # noqa: E402
from pipeline.train.model import ModelSpec  # noqa: E402
from pipeline.train.ps import ParameterServer  # noqa: E402
from pipeline.train.server import parameter_server  # noqa: E402
from producers import Replay, datasets  # noqa: E402
from tests.cluster import multihost, netns  # noqa: E402

SEED_2_HOSTS_S = 723.9
#: dist-keras's MNIST CNN's weight arrays (1,048,853 weights; 99% in the first dense kernel).
CNN_SHAPES = ((3, 3, 1, 32), (32,), (3, 3, 32, 32), (32,), (4608, 225), (225,), (225, 10), (10,))
PER_TRIGGER = 10_000
#: The straggler arm's asynchronous algorithm: its workers never wait for each other, so its
#: hog-over-even ratio is what the hog leaves of this machine, the synchronous figure's ceiling.
ASYNC_CEILING = "adag"
ARMS = ("even", "hog", "async-even", "async-hog")


def _run_args(records: int) -> list[str]:
    return [
        "--dataset",
        "mnist",
        "--max-offsets-per-trigger",
        str(PER_TRIGGER),
        "--max-batches",
        str(-(-records // PER_TRIGGER)),
        "--eval-every",
        "1000",
        "--seed",
        "1",
    ]


def _figures(out: Path) -> dict[str, Any]:
    report = json.loads((out / "report.json").read_text())
    return {
        "epoch_s": report["train_seconds"],
        "records": report["trained_records"],
        "acc": report["final"]["accuracy"],
        "records_per_s": report["records_per_s"],
        "transports": sorted({t["transport"] for row in report["batches"] for t in row["tasks"]}),
    }


def local_mode(folder: Path, records: int) -> dict[str, Any]:
    """The epoch in Spark's local mode (two workers, shared memory), from a filled topic."""
    broker = EmbeddedBroker(port=0).start()
    try:
        Replay(
            datasets.get("mnist"),
            bootstrap=broker.bootstrap,
            topic="bench-local",
            partitions=2,
            limit=records,
        ).run()
        out = folder / "local"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "run",
                *_run_args(records),
                "--bootstrap",
                broker.bootstrap,
                "--topic",
                "bench-local",
                "--out",
                str(out),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode != 0:
            raise SystemExit(f"local run failed: {done.stderr.strip().splitlines()[-1:]}")
    finally:
        broker.stop()
    return _figures(out)


def on_cluster(folder: Path, records: int) -> dict[str, Any]:
    """The epoch on the namespace cluster (two 1-core workers on other hosts, TCP)."""
    with multihost.running(folder / "cluster") as cluster:
        cluster.produce("mnist", "bench-cluster", records)
        out, log = folder / "cluster-run", folder / "cluster-run.log"
        run = cluster.streamtrain(
            "driver",
            "run",
            *_run_args(records),
            "--master",
            cluster.spark.master,
            "--spark-conf",
            str(cluster.spark.conf),
            "--bootstrap",
            cluster.bootstrap,
            "--topic",
            "bench-cluster",
            "--out",
            str(out),
            log=log,
        )
        try:
            if run.wait(1800) != 0:
                raise SystemExit(f"cluster run failed: {log.read_text().strip().splitlines()[-1:]}")
        finally:
            multihost.stop(run)
    return _figures(out)


def _exactly_once(out: Path, records: int) -> bool:
    """Every record trained, and every task's mini-batches counted as applied by the server."""
    report = json.loads((out / "report.json").read_text())
    tasks = [t for row in report["batches"] for t in row["tasks"]]
    return report["trained_records"] == records and all(t["steps"] == t["applied"] for t in tasks)


def _pin(pid: int, cpu: int) -> None:
    """Every thread of ``pid`` onto ``cpu``; the processes it starts later inherit it."""
    subprocess.run(
        ["taskset", "-a", "-p", "-c", str(cpu), str(pid)],
        check=True,
        capture_output=True,
        timeout=30,
    )


def straggler(folder: Path, records: int, timeout_s: float = 1800) -> dict[str, Any]:
    """records/s of the default algorithm on the 2-host cluster with worker-b's core shared
    with a CPU hog, over the same run without it; and the same pair for an asynchronous
    algorithm, whose workers never wait for each other: this machine's ceiling for the
    figure (module docstring)."""
    with multihost.running(folder / "straggler") as cluster:
        worker_a, worker_b = cluster.spark.procs[1].pid, cluster.spark.procs[2].pid
        _pin(worker_a, 0)
        _pin(worker_b, 1)
        conf = folder / "speculation.conf"
        conf.write_text(cluster.spark.conf.read_text() + "spark.speculation true\n")
        conf.chmod(0o600)
        figures: dict[str, Any] = {}
        for arm in ARMS:
            cluster.produce("mnist", f"bench-{arm}", records)
            hog = None
            if arm.endswith(
                "hog"
            ):  # a busy loop that ends by itself, whatever happens to this process
                hog = subprocess.Popen(
                    [
                        *cluster.hosts.run("worker-b"),
                        "taskset",
                        "-c",
                        "1",
                        sys.executable,
                        "-c",
                        f"import time\nend = time.monotonic() + {timeout_s}\n"
                        "while time.monotonic() < end: pass",
                    ],
                    start_new_session=True,
                )
            out, log = folder / f"straggler-{arm}", folder / f"straggler-{arm}.log"
            algorithm = ["--algorithm", ASYNC_CEILING] if arm.startswith("async") else []
            run = cluster.streamtrain(
                "driver",
                "run",
                *_run_args(records),
                *algorithm,
                "--master",
                cluster.spark.master,
                "--spark-conf",
                str(conf),
                "--bootstrap",
                cluster.bootstrap,
                "--topic",
                f"bench-{arm}",
                "--out",
                str(out),
                log=log,
            )
            try:
                if run.wait(timeout_s) != 0:
                    raise SystemExit(
                        f"straggler {arm} run failed: {log.read_text().strip().splitlines()[-1:]}"
                    )
            finally:
                multihost.stop(run)
                if hog is not None:
                    multihost.stop(hog)
            report = json.loads((out / "report.json").read_text())
            figures[arm] = {
                **_figures(out),
                "exactly_once": _exactly_once(out, records),
                "short_rounds": report["parameter_server"].get("short_rounds", 0),
                "speculative": sum(
                    t["repeats"] > 0 or t["attempt"] > 0
                    for row in report["batches"]
                    for t in row["tasks"]
                ),
            }
    figures["straggler_ratio"] = figures["hog"]["records_per_s"] / figures["even"]["records_per_s"]
    figures["async_ratio"] = (
        figures["async-hog"]["records_per_s"] / figures["async-even"]["records_per_s"]
    )
    return figures


def _straggler_line(f: dict[str, Any]) -> str:
    return (
        f"straggler_ratio={f['straggler_ratio']:.2f} async_ratio={f['async_ratio']:.2f} "
        f"ceiling_share={f['straggler_ratio'] / f['async_ratio']:.2f} "
        f"acc={f['hog']['acc']:.4f}/{f['even']['acc']:.4f} "
        f"even_rps={f['even']['records_per_s']:.0f} hog_rps={f['hog']['records_per_s']:.0f} "
        f"short_rounds={f['hog']['short_rounds']} speculative={f['hog']['speculative']} "
        f"exactly_once={_exactly_once_all(f)}"
    )


def _exactly_once_all(f: dict[str, Any]) -> str:
    """Whether every straggler arm trained every record once, as the last lines print it."""
    return str(all(f[arm]["exactly_once"] for arm in ARMS)).lower()


def ps_capacity(seconds: float) -> dict[int, float]:
    """Round trips (push and pull of the CNN's weights) per second over TCP, by clients."""
    import numpy as np

    weights = np.zeros(WEIGHTS, np.float32)
    with ParameterServer(weights, secret=b"bench-secret", shared_memory=False) as server:
        return {
            n: pushes_per_s(server.address, n, False, "aes-gcm", "float32", seconds)
            for n in (2, 8, 16)
        }


def shard_capacity(seconds: float, clients: int = 16) -> dict[int, float]:
    """Exchanges (push+pull of the CNN's weights over TCP) applied a second with ``clients``
    clients, by parameter-server shards: 1 (the server in this process) and 2 (processes)."""
    import numpy as np

    spec = ModelSpec("{}", "adam", "sparse_categorical_crossentropy", CNN_SHAPES)
    assert spec.size == WEIGHTS
    weights = np.zeros(WEIGHTS, np.float32)
    rates = {}
    for shards in (1, 2):
        server = parameter_server(
            algorithms.get("downpour"),
            spec,
            weights,
            host="127.0.0.1",
            shared_memory=False,
            secret=b"bench-secret",
            shards=shards,
        )
        with server:
            target = getattr(server, "shards", ()) or server.address
            rates[shards] = pushes_per_s(target, clients, False, "aes-gcm", "float32", seconds)
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--records",
        type=int,
        default=60_000,
        help="records in the epoch (MNIST's train split: 60,000)",
    )
    ap.add_argument(
        "--seconds", type=float, default=4.0, help="seconds per parameter-server capacity point"
    )
    ap.add_argument(
        "--shards-only", action="store_true", help="measure the parameter-server shards alone"
    )
    ap.add_argument(
        "--straggler-records", type=int, default=30_000, help="records in each straggler arm's run"
    )
    ap.add_argument("--straggler-only", action="store_true", help="measure the straggler arm alone")
    args = ap.parse_args()
    if args.shards_only:
        rates = shard_capacity(args.seconds)
        print(
            f"ps shards_1_per_s={rates[1]:.1f} shards_2_per_s={rates[2]:.1f} "
            f"shard_ratio_2={rates[2] / rates[1]:.2f}"
        )
        return
    why = netns.missing()
    if why:
        raise SystemExit(f"bench/cluster.py needs network namespaces: {why}")
    if args.straggler_only:
        with tempfile.TemporaryDirectory() as tmp:
            figures = straggler(Path(tmp), args.straggler_records)
        print(json.dumps(figures))
        print(f"cluster {_straggler_line(figures)}")
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print("local mode ...", file=sys.stderr, flush=True)
        local = local_mode(folder, args.records)
        print(f"local mode: {local}\ncluster ...", file=sys.stderr, flush=True)
        cluster = on_cluster(folder, args.records)
        print(f"cluster: {cluster}\nstraggler ...", file=sys.stderr, flush=True)
        slowed = straggler(folder, args.straggler_records)
        print(f"straggler: {slowed}\nparameter-server capacity ...", file=sys.stderr, flush=True)
    pushes = ps_capacity(args.seconds)
    mbps = {n: round(p * WEIGHTS * 4 / 1e6, 1) for n, p in pushes.items()}
    shards = shard_capacity(args.seconds)
    print(
        json.dumps(
            {
                "local": local,
                "cluster": cluster,
                "straggler": slowed,
                "ps_pushes_per_s": pushes,
                "ps_mbps": mbps,
                "ps_shards_per_s": shards,
                "cpus": os.cpu_count(),
            }
        )
    )
    print(
        f"cluster epoch_s={cluster['epoch_s']:.1f} local_epoch_s={local['epoch_s']:.1f} "
        f"ratio_vs_local={local['epoch_s'] / cluster['epoch_s']:.2f} acc={cluster['acc']:.4f} "
        f"seed_speedup={SEED_2_HOSTS_S / cluster['epoch_s']:.1f} ps_mbps_16={mbps[16]:.0f} "
        f"shard_ratio_2={shards[2] / shards[1]:.2f} "
        f"straggler_ratio={slowed['straggler_ratio']:.2f} "
        f"exactly_once={_exactly_once_all(slowed)}"
    )


if __name__ == "__main__":
    main()
