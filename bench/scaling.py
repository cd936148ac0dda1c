"""A discrete-event model of workers exchanging with parameter servers, fed with the costs
``bench/ps.py`` measures: records/s, staleness and the busiest resource for a number of
workers and of shards (servers that each hold a slice of the weights). It simulates; it
measures nothing, and runs in seconds on any machine (docs/scaling.md reads its table).

Each worker computes ``window`` mini-batches, then exchanges (PUSH_PULL) with every shard
at once and waits for all of them. On a shard an exchange takes its slice's bytes in
through the NIC, opens them on one of the shard's cores, applies the update under the
shard's lock (its clock moves), seals the center on a core and sends it out through the
NIC; every resource serves first come, first served.

    .venv/bin/python bench/scaling.py [--weights 1048853] [--wire-bytes 4] [--gbit 25] [--cores 16]

Last line: ``scaling workers=<n> shards=<s> records_per_s=<r> ...`` for the largest case.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
from collections import deque

#: Measured on the development machine (bench/ps.py, docs/scaling.md): the server's CPU
#: per exchange, sealed, by bytes a weight on the wire (float32: 4, bfloat16: 2); the
#: update under the lock ~0.33 ns a weight (estimated from a memcpy's time).
CPU_NS_PER_WEIGHT, LOCK_NS_PER_WEIGHT = {4: 4.2, 2: 3.4}, 0.33


class Station:
    """A resource with ``servers`` identical servers and one first-come queue."""

    def __init__(self, servers: int) -> None:
        self.servers, self.busy, self.queue, self.busy_s = (
            servers,
            0,
            deque[tuple[int, float]](),
            0.0,
        )


def simulate(
    workers: int,
    shards: int,
    *,
    weights: int,
    wire_bytes: int,
    gbit: float,
    cores: int,
    compute_s: float,
    records_per_exchange: int,
    seconds: float = 30.0,
) -> dict[str, float]:
    """Run the model for ``seconds`` of simulated time; its throughput, staleness and busiest
    resource."""
    share = weights / shards
    nic_s = share * wire_bytes * 8 / (gbit * 1e9)
    cpu_s = share * CPU_NS_PER_WEIGHT[wire_bytes] * 1e-9 / 2  # open, then seal
    lock_s = share * LOCK_NS_PER_WEIGHT * 1e-9
    stations = {
        (s, kind): Station(cores if kind.startswith("cpu") else 1)
        for s in range(shards)
        for kind in ("nic_in", "cpu_open", "lock", "cpu_seal", "nic_out")
    }
    stages = [
        ("nic_in", nic_s),
        ("cpu_open", cpu_s),
        ("lock", lock_s),
        ("cpu_seal", cpu_s),
        ("nic_out", nic_s),
    ]
    clocks = [0] * shards
    pulled = [
        [0] * shards for _ in range(workers)
    ]  # each worker's clock of each shard at its last pull
    waiting = [0] * workers  # shards a worker's exchange still waits for
    events: list[
        tuple[float, int, str, int, int, int]
    ] = []  # time, tiebreak, what, worker, shard, stage
    order = itertools.count()
    exchanges, staleness = 0, []

    def arrive(now: float, worker: int, shard: int, stage: int) -> None:
        station = stations[shard, stages[stage][0]]
        if station.busy < station.servers:
            station.busy += 1
            station.busy_s += stages[stage][1]
            heapq.heappush(
                events, (now + stages[stage][1], next(order), "done", worker, shard, stage)
            )
        else:
            station.queue.append((worker, stage))

    for w in range(workers):  # the workers start spread over one compute period
        heapq.heappush(events, (compute_s * w / workers, next(order), "exchange", w, 0, 0))
    while events:
        now, _, what, worker, shard, stage = heapq.heappop(events)
        if now > seconds:
            break
        if what == "exchange":
            waiting[worker] = shards
            for s in range(shards):
                arrive(now, worker, s, 0)
            continue
        station = stations[shard, stages[stage][0]]
        station.busy -= 1
        if station.queue:
            nxt, nxt_stage = station.queue.popleft()
            arrive(now, nxt, shard, nxt_stage)
        if stages[stage][0] == "lock":  # the update is applied: the shard's clock moves
            staleness.append(clocks[shard] - pulled[worker][shard])
            clocks[shard] += 1
            pulled[worker][shard] = clocks[shard]  # the center it gets back
        if stage + 1 < len(stages):
            arrive(now, worker, shard, stage + 1)
            continue
        waiting[worker] -= 1
        if waiting[worker] == 0:
            exchanges += 1
            heapq.heappush(events, (now + compute_s, next(order), "exchange", worker, 0, 0))
    busiest = max(stations.items(), key=lambda kv: kv[1].busy_s / kv[1].servers)
    staleness.sort()
    return {
        "exchanges_per_s": exchanges / seconds,
        "records_per_s": exchanges * records_per_exchange / seconds,
        "staleness_p50": float(staleness[len(staleness) // 2]) if staleness else 0.0,
        "busiest": busiest[0][1],
        "busiest_use": busiest[1].busy_s / busiest[1].servers / seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--weights",
        type=int,
        default=1_048_853,
        help="the model's weights (default: the MNIST CNN)",
    )
    ap.add_argument(
        "--wire-bytes",
        type=int,
        default=4,
        choices=(2, 4),
        help="4: float32; 2: bfloat16 or float16",
    )
    ap.add_argument("--gbit", type=float, default=25.0, help="each server's NIC, Gbit/s")
    ap.add_argument("--cores", type=int, default=16, help="each server's cores")
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--step-ms", type=float, default=12.0, help="a worker's mini-batch, ms")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=20.0, help="simulated time per case")
    args = ap.parse_args()
    print(
        f"{args.weights:,} weights x {args.wire_bytes} bytes; each server {args.gbit:g} Gbit/s, "
        f"{args.cores} cores; an exchange every {args.window} x {args.step_ms:g} ms of compute"
    )
    print(f"{'workers':>7} {'shards':>6} {'exch/s':>8} {'records/s':>10} {'stale p50':>9}  busiest")
    last = ""
    for workers in (8, 64, 256):
        for shards in (1, 2, 4, 8, 16):
            r = simulate(
                workers,
                shards,
                weights=args.weights,
                wire_bytes=args.wire_bytes,
                gbit=args.gbit,
                cores=args.cores,
                compute_s=args.window * args.step_ms / 1000,
                records_per_exchange=args.window * args.batch_size,
                seconds=args.seconds,
            )
            print(
                f"{workers:>7} {shards:>6} {r['exchanges_per_s']:>8.0f} "
                f"{r['records_per_s']:>10.0f} {r['staleness_p50']:>9.0f}  {r['busiest']} "
                f"({r['busiest_use']:.0%})"
            )
            last = (
                f"scaling workers={workers} shards={shards} records_per_s={r['records_per_s']:.0f} "
                f"staleness_p50={r['staleness_p50']:.0f} busiest={r['busiest']}"
            )
    print(last)


if __name__ == "__main__":
    main()
