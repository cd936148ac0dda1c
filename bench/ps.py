"""Benchmark: parameter-server exchange of the MNIST CNN's 1,048,853 weights over loopback.

Clients run in their own processes, as executors would. Measured in one run, for
shared memory (the default for workers on the server's machine) and for TCP:
push+pull round trips (p50, p99), pushes applied per second with 2 and 4
concurrent clients, and a memcpy of the same buffer as the floor.

    .venv/bin/python bench/ps.py [--roundtrips 300] [--seconds 4]

Last line (the first four for shared memory): ``ps roundtrip_ms_p50=<n> roundtrip_ms_p99=<n>
pushes_per_s=<n> ratio_vs_memcpy=<r> tcp_roundtrip_ms_p50=<n> tcp_pushes_per_s=<n> tcp_mac_share=<r>``
(tcp_mac_share: the four payload MACs of a TCP round trip, as a share of its p50).
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import multiprocessing as mp
import time

import numpy as np

from pipeline.train.ps import Client, ParameterServer

WEIGHTS = 1_048_853  # dist-keras's MNIST CNN
SECRET = b"bench-secret"


def _roundtrips(address: tuple[str, int], n: int, shared: bool, out: mp.Queue) -> None:  # type: ignore[type-arg]
    delta = np.full(WEIGHTS, 1e-6, np.float32)
    times = []
    with Client(address, secret=SECRET, worker=0, size=WEIGHTS, shared_memory=shared) as c:
        assert c.shared == shared, "shared memory was not set up"
        c.pull()
        for _ in range(n + 10):
            started = time.perf_counter()
            c.push_pull(delta)
            times.append(time.perf_counter() - started)
    out.put(times[10:])  # the first few warm the socket buffers


def _hammer(address: tuple[str, int], worker: int, shared: bool, seconds: float, go: mp.Event,
            out: mp.Queue) -> None:  # type: ignore[type-arg]
    delta = np.full(WEIGHTS, 1e-6, np.float32)
    with Client(address, secret=SECRET, worker=worker, size=WEIGHTS, shared_memory=shared) as c:
        c.pull()
        go.wait()
        started, n = time.perf_counter(), 0
        while time.perf_counter() - started < seconds:
            c.push_pull(delta)
            n += 1
    out.put((n, time.perf_counter() - started))


def pushes_per_s(address: tuple[str, int], clients: int, shared: bool, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_hammer, args=(address, w, shared, seconds, go, out)) for w in range(clients)]
    for proc in procs:
        proc.start()
    time.sleep(1.5)  # let every client connect and pull before the clock starts
    go.set()
    results = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join()
    return sum(n for n, _ in results) / max(t for _, t in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--roundtrips", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()

    src = np.random.default_rng(0).standard_normal(WEIGHTS).astype(np.float32)
    dst = np.empty_like(src)
    copies = []
    for _ in range(200):
        started = time.perf_counter()
        np.copyto(dst, src)
        copies.append(time.perf_counter() - started)
    memcpy_ms = float(np.median(copies)) * 1000
    # What authenticating a TCP payload costs: one HMAC-SHA256 of the buffer. A TCP round
    # trip makes four (the worker signs its push, the server checks it, signs the center
    # it sends back, and the worker checks that); shared-memory frames MAC the header only.
    macs = []
    for _ in range(50):
        started = time.perf_counter()
        hmac.new(SECRET, src.data.cast("B"), hashlib.sha256).digest()
        macs.append(time.perf_counter() - started)
    mac_ms = float(np.median(macs)) * 1000

    figures = {shared: measure(src, shared, args.roundtrips, args.seconds) for shared in (True, False)}
    mb = WEIGHTS * 4 / 1e6
    print(f"buffer {mb:.1f} MB; memcpy {memcpy_ms:.2f} ms; HMAC-SHA256 {mac_ms:.2f} ms")
    for shared, (p50, p99, rates) in figures.items():
        print(f"{'shared memory' if shared else 'TCP':>13}: push+pull p50 {p50:.2f} ms p99 {p99:.2f} ms; "
              f"pushes applied/s: 2 clients {rates[2]:.0f}, 4 clients {rates[4]:.0f}")
    (p50, p99, rates), (tcp_p50, _, tcp_rates) = figures[True], figures[False]
    # A round trip moves the buffer twice (push, pull): the floor is two memcpys.
    print(f"ps roundtrip_ms_p50={p50:.2f} roundtrip_ms_p99={p99:.2f} pushes_per_s={min(rates.values()):.0f} "
          f"ratio_vs_memcpy={p50 / (2 * memcpy_ms):.1f} tcp_roundtrip_ms_p50={tcp_p50:.2f} "
          f"tcp_pushes_per_s={min(tcp_rates.values()):.0f} tcp_mac_share={4 * mac_ms / tcp_p50:.2f}")


def measure(src: np.ndarray, shared: bool, roundtrips: int, seconds: float) -> tuple[float, float, dict[int, float]]:
    """Round-trip p50 and p99 (ms) and pushes/s for 2 and 4 clients, over one transport."""
    with ParameterServer(src, secret=SECRET) as server:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        proc = ctx.Process(target=_roundtrips, args=(server.address, roundtrips, shared, out))
        proc.start()
        times = np.array(out.get(timeout=300)) * 1000
        proc.join()
        rates = {k: pushes_per_s(server.address, k, shared, seconds) for k in (2, 4)}
    return float(np.percentile(times, 50)), float(np.percentile(times, 99)), rates


if __name__ == "__main__":
    main()
