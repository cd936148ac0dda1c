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

    sudo .venv/bin/python bench/cluster.py [--records 60000] [--seconds 4]
    .venv/bin/python bench/cluster.py --shards-only [--seconds 4]    # the shards' figure alone

The seeds (dist-keras on Spark, TF 1) took 1,497.9 s for this epoch on a 3-worker Docker
cluster and 723.9 s on 2 hosts x 2 workers; ``seed_speedup`` is that 723.9 s over the
cluster's epoch here. Last line: ``cluster epoch_s=<s> local_epoch_s=<s> ratio_vs_local=<r>
acc=<a> seed_speedup=<x> ps_mbps_16=<n>`` (ratio_vs_local: local mode's epoch time over the
cluster's, so above 1 the cluster is the faster; ps_mbps: weights moved each way, MB/s;
shard_ratio_2: exchanges applied a second with 2 shards over 1, 16 clients). With
``--shards-only``: ``ps shards_1_per_s=<n> shards_2_per_s=<n> shard_ratio_2=<r>``.
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


def _run_args(records: int) -> list[str]:
    return ["--dataset", "mnist", "--max-offsets-per-trigger", str(PER_TRIGGER), "--max-batches",
            str(-(-records // PER_TRIGGER)), "--eval-every", "1000", "--seed", "1"]


def _figures(out: Path) -> dict[str, Any]:
    report = json.loads((out / "report.json").read_text())
    return {"epoch_s": report["train_seconds"], "records": report["trained_records"],
            "acc": report["final"]["accuracy"], "records_per_s": report["records_per_s"],
            "transports": sorted({t["transport"] for row in report["batches"] for t in row["tasks"]})}


def local_mode(folder: Path, records: int) -> dict[str, Any]:
    """The epoch in Spark's local mode (two workers, shared memory), from a filled topic."""
    broker = EmbeddedBroker(port=0).start()
    try:
        Replay(datasets.get("mnist"), bootstrap=broker.bootstrap, topic="bench-local", partitions=2,
               limit=records).run()
        out = folder / "local"
        done = subprocess.run([sys.executable, "-m", "pipeline", "run", *_run_args(records), "--bootstrap",
                               broker.bootstrap, "--topic", "bench-local", "--out", str(out)],
                              cwd=ROOT, capture_output=True, text=True, timeout=1800)
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
        run = cluster.streamtrain("driver", "run", *_run_args(records), "--master", cluster.spark.master,
                                  "--spark-conf", str(cluster.spark.conf), "--bootstrap", cluster.bootstrap,
                                  "--topic", "bench-cluster", "--out", str(out), log=log)
        try:
            if run.wait(1800) != 0:
                raise SystemExit(f"cluster run failed: {log.read_text().strip().splitlines()[-1:]}")
        finally:
            multihost.stop(run)
    return _figures(out)


def ps_capacity(seconds: float) -> dict[int, float]:
    """Round trips (push and pull of the CNN's weights) per second over TCP, by clients."""
    import numpy as np

    weights = np.zeros(WEIGHTS, np.float32)
    with ParameterServer(weights, secret=b"bench-secret", shared_memory=False) as server:
        return {n: pushes_per_s(server.address, n, False, "aes-gcm", "float32", seconds) for n in (2, 8, 16)}


def shard_capacity(seconds: float, clients: int = 16) -> dict[int, float]:
    """Exchanges (push+pull of the CNN's weights over TCP) applied a second with ``clients``
    clients, by parameter-server shards: 1 (the server in this process) and 2 (processes)."""
    import numpy as np

    spec = ModelSpec("{}", "adam", "sparse_categorical_crossentropy", CNN_SHAPES)
    assert spec.size == WEIGHTS
    weights = np.zeros(WEIGHTS, np.float32)
    rates = {}
    for shards in (1, 2):
        server = parameter_server(algorithms.get("downpour"), spec, weights, host="127.0.0.1", shared_memory=False,
                                  secret=b"bench-secret", shards=shards)
        with server:
            target = getattr(server, "shards", ()) or server.address
            rates[shards] = pushes_per_s(target, clients, False, "aes-gcm", "float32", seconds)
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=60_000, help="records in the epoch (MNIST's train split: 60,000)")
    ap.add_argument("--seconds", type=float, default=4.0, help="seconds per parameter-server capacity point")
    ap.add_argument("--shards-only", action="store_true", help="measure the parameter-server shards alone")
    args = ap.parse_args()
    if args.shards_only:
        rates = shard_capacity(args.seconds)
        print(f"ps shards_1_per_s={rates[1]:.1f} shards_2_per_s={rates[2]:.1f} shard_ratio_2={rates[2] / rates[1]:.2f}")
        return
    why = netns.missing()
    if why:
        raise SystemExit(f"bench/cluster.py needs network namespaces: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        print("local mode ...", file=sys.stderr, flush=True)
        local = local_mode(folder, args.records)
        print(f"local mode: {local}\ncluster ...", file=sys.stderr, flush=True)
        cluster = on_cluster(folder, args.records)
        print(f"cluster: {cluster}\nparameter-server capacity ...", file=sys.stderr, flush=True)
    pushes = ps_capacity(args.seconds)
    mbps = {n: round(p * WEIGHTS * 4 / 1e6, 1) for n, p in pushes.items()}
    shards = shard_capacity(args.seconds)
    print(json.dumps({"local": local, "cluster": cluster, "ps_pushes_per_s": pushes, "ps_mbps": mbps,
                      "ps_shards_per_s": shards, "cpus": os.cpu_count()}))
    print(f"cluster epoch_s={cluster['epoch_s']:.1f} local_epoch_s={local['epoch_s']:.1f} "
          f"ratio_vs_local={local['epoch_s'] / cluster['epoch_s']:.2f} acc={cluster['acc']:.4f} "
          f"seed_speedup={SEED_2_HOSTS_S / cluster['epoch_s']:.1f} ps_mbps_16={mbps[16]:.0f} "
          f"shard_ratio_2={shards[2] / shards[1]:.2f}")


if __name__ == "__main__":
    main()
