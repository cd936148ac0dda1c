"""Benchmark: parameter-server exchange of the MNIST CNN's 1,048,853 weights over loopback.

Clients run in their own processes, as executors would. Measured in one run: push+pull
round trips (p50, p99) and pushes applied per second with 2 and 4 concurrent clients, for
shared memory (the default for workers on the server's machine) and for TCP three ways:
sealed with AES-256-GCM (what the server speaks), with the HMAC-SHA256 protocol it replaced
(version 3, rebuilt here for the comparison: payload in clear, a MAC over header and
payload each way) and with no cryptography at all (the floor); and a memcpy of the buffer.

    .venv/bin/python bench/ps.py [--roundtrips 300] [--seconds 4]

Last line (the first four for shared memory): ``ps roundtrip_ms_p50=<n> roundtrip_ms_p99=<n>
pushes_per_s=<n> ratio_vs_memcpy=<r> tcp_roundtrip_ms_p50=<n> tcp_pushes_per_s=<n>
tcp_server_cpu_ms=<n> tcp_crypto_share=<r> tcp_plain_roundtrip_ms_p50=<n> tcp_hmac_pushes_per_s=<n>
tcp_speedup_vs_hmac=<r> tcp_bf16_roundtrip_ms_p50=<n> tcp_bf16_speedup_vs_hmac=<r>``.
tcp_crypto_share: the four AES-GCM passes of a TCP round trip (the worker seals its push,
the server opens it, seals the center and the worker opens that), each timed alone on the
buffer, as a share of the sealed round trip's p50; tcp_server_cpu_ms: the server's CPU per
sealed TCP round trip (one client); tcp_speedup_vs_hmac: sealed TCP pushes/s over the HMAC
protocol's (the fewer of 2 and 4 clients, each); tcp_bf16_*: the sealed TCP round trip with
bfloat16 on the wire (``--wire-dtype bfloat16``: half the bytes), and its pushes/s over the
HMAC protocol's float32.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import multiprocessing as mp
import os
import time
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from pipeline.train.ps import Client, ParameterServer, ShardedClient
from pipeline.train.ps import channel as ps_channel
from pipeline.train.ps import protocol as p
from pipeline.train.ps import transport as ps_transport

WEIGHTS = 1_048_853  # dist-keras's MNIST CNN
SECRET = b"bench-secret"


class HmacSession:
    """Protocol version 3's frames, for comparison only: payload in clear, HMAC-SHA256 (to 16
    bytes) over the header and payload, keyed per direction; received straight into place."""

    def __init__(self, seal_key: bytes, open_key: bytes) -> None:
        self._seal_key, self._open_key = seal_key, open_key

    @classmethod
    def client(cls, keys: p.Keys, capacity: int = 0) -> HmacSession:
        return cls(keys.request, keys.reply)

    @classmethod
    def server(cls, keys: p.Keys, capacity: int = 0) -> HmacSession:
        return cls(keys.reply, keys.request)

    @staticmethod
    def _mac(key: bytes, h: p.Header, payload: p.Buffer) -> bytes:
        m = hmac.new(key, p._aad(h), hashlib.sha256)
        if len(payload):
            m.update(payload)
        return m.digest()[: p.TAG_BYTES]

    def seal(
        self, h: p.Header, payload: p.Buffer = b"", room: memoryview | None = None
    ) -> tuple[bytes, p.Buffer]:
        header = p._aad(h)
        return header[: -p.TAG_BYTES] + self._mac(self._seal_key, h, payload), payload

    def inlet(self, n: int, into: memoryview, room: memoryview | None = None) -> memoryview:
        return into[:n]

    def open(self, h: p.Header, into: memoryview, room: memoryview | None = None) -> bool:
        return hmac.compare_digest(self._mac(self._open_key, h, into[: h.length]), h.tag)


class PlainSession(HmacSession):
    """No cryptography on the frames at all: the floor a TCP round trip could reach."""

    def seal(
        self, h: p.Header, payload: p.Buffer = b"", room: memoryview | None = None
    ) -> tuple[bytes, p.Buffer]:
        return p.pack(h), payload

    def open(self, h: p.Header, into: memoryview, room: memoryview | None = None) -> bool:
        return True


SESSIONS = {"aes-gcm": p.Session, "hmac": HmacSession, "plain": PlainSession}


def _use(protocol: str) -> None:
    """Seal this process's frames as ``protocol`` (server and workers must agree)."""
    ps_transport.SESSION = ps_channel.SESSION = SESSIONS[protocol]  # type: ignore[assignment]


def _connect(target: Any, **kwargs: Any) -> Client | ShardedClient:
    """A client of one server (``(host, port)``) or of a sharded one (its shards' ``(host, port,
    start, stop)``)."""
    if target and isinstance(target[0], tuple | list):
        return ShardedClient([tuple(s) for s in target], **kwargs)
    return Client(tuple(target), **kwargs)


def _roundtrips(
    address: tuple[str, int], n: int, shared: bool, protocol: str, dtype: str, out: mp.Queue
) -> None:  # type: ignore[type-arg]
    _use(protocol)
    delta = np.full(WEIGHTS, 1e-6, np.float32)
    times = []
    with Client(
        address, secret=SECRET, worker=0, size=WEIGHTS, shared_memory=shared, wire_dtype=dtype
    ) as c:
        assert c.shared == shared, "shared memory was not set up"
        c.pull()
        for _ in range(n + 10):
            started = time.perf_counter()
            c.push_pull(delta)
            times.append(time.perf_counter() - started)
    out.put(times[10:])  # the first few warm the socket buffers


def _hammer(
    address: Any,
    worker: int,
    shared: bool,
    protocol: str,
    dtype: str,
    seconds: float,
    go: mp.Event,
    out: mp.Queue,
) -> None:  # type: ignore[type-arg]
    _use(protocol)
    delta = np.full(WEIGHTS, 1e-6, np.float32)
    with _connect(
        address, secret=SECRET, worker=worker, size=WEIGHTS, shared_memory=shared, wire_dtype=dtype
    ) as c:
        c.pull()
        go.wait()
        started, n = time.perf_counter(), 0
        while time.perf_counter() - started < seconds:
            c.push_pull(delta)
            n += 1
    out.put((n, time.perf_counter() - started))


def pushes_per_s(
    address: Any, clients: int, shared: bool, protocol: str, dtype: str, seconds: float
) -> float:
    ctx = mp.get_context("spawn")
    out, go = ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_hammer, args=(address, w, shared, protocol, dtype, seconds, go, out))
        for w in range(clients)
    ]
    for proc in procs:
        proc.start()
    time.sleep(1.5)  # let every client connect and pull before the clock starts
    go.set()
    results = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join()
    return sum(n for n, _ in results) / max(t for _, t in results)


def _median_ms(f: object, times: int) -> float:
    spent = []
    for _ in range(times):
        started = time.perf_counter()
        f()  # type: ignore[operator]
        spent.append(time.perf_counter() - started)
    return float(np.median(spent)) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--roundtrips", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=4.0)
    args = ap.parse_args()

    src = np.random.default_rng(0).standard_normal(WEIGHTS).astype(np.float32)
    dst = np.empty_like(src)
    memcpy_ms = _median_ms(lambda: np.copyto(dst, src), 200)
    payload = src.data.cast("B")
    # The cryptography of a TCP round trip, a pass at a time: the HMAC protocol made four
    # HMACs of the buffer, the sealed one makes four AES-GCM passes (seal, open, seal, open),
    # each into a buffer allocated once, as the server and the client do.
    mac_ms = _median_ms(lambda: hmac.new(SECRET, payload, hashlib.sha256).digest(), 50)
    aead, nonce, aad = AESGCM(os.urandom(32)), bytes(12), bytes(p.HEADER.size)
    sealed = bytearray(len(payload) + p.TAG_BYTES)
    seal_ms = _median_ms(lambda: aead.encrypt_into(nonce, payload, aad, sealed), 50)
    open_ms = _median_ms(lambda: aead.decrypt_into(nonce, sealed, aad, dst.data.cast("B")), 50)
    # The alternative the sealing could take: AESGCM.encrypt returns new bytes (an allocation
    # of the buffer's size and its page faults, every frame).
    alloc_ms = _median_ms(lambda: aead.encrypt(nonce, payload, aad), 50)

    runs = {
        ("shared", "aes-gcm", "float32"): True,
        ("tcp", "aes-gcm", "float32"): False,
        ("tcp", "hmac", "float32"): False,
        ("tcp", "plain", "float32"): False,
        ("tcp", "aes-gcm", "bfloat16"): False,
    }
    figures = {
        key: measure(src, shared, key[1], key[2], args.roundtrips, args.seconds)
        for key, shared in runs.items()
    }
    mb = WEIGHTS * 4 / 1e6
    print(
        f"buffer {mb:.1f} MB; memcpy {memcpy_ms:.2f} ms; HMAC-SHA256 {mac_ms:.2f} ms; AES-256-GCM "
        f"seal {seal_ms:.2f} ms, open {open_ms:.2f} ms (sealing into new bytes: {alloc_ms:.2f} "
        "ms)"
    )
    for (transport, protocol, dtype), (p50, p99, server_ms, rates) in figures.items():
        print(
            f"{transport + ' ' + protocol + ' ' + dtype:>25}: push+pull p50 {p50:.2f} ms p99 "
            f"{p99:.2f} ms (server CPU {server_ms:.2f} ms); pushes applied/s: 2 clients "
            f"{rates[2]:.0f}, 4 clients {rates[4]:.0f}"
        )
    (p50, p99, _, rates) = figures["shared", "aes-gcm", "float32"]
    (tcp_p50, _, tcp_server_ms, tcp_rates) = figures["tcp", "aes-gcm", "float32"]
    (_, _, _, hmac_rates), (plain_p50, _, _, _) = (
        figures["tcp", "hmac", "float32"],
        figures["tcp", "plain", "float32"],
    )
    tcp_rate, hmac_rate = min(tcp_rates.values()), min(hmac_rates.values())
    bf16_p50, _, _, bf16_rates = figures["tcp", "aes-gcm", "bfloat16"]
    # A round trip moves the buffer twice (push, pull): the floor is two memcpys.
    print(
        f"ps roundtrip_ms_p50={p50:.2f} roundtrip_ms_p99={p99:.2f} "
        f"pushes_per_s={min(rates.values()):.0f} ratio_vs_memcpy={p50 / (2 * memcpy_ms):.1f} "
        f"tcp_roundtrip_ms_p50={tcp_p50:.2f} tcp_pushes_per_s={tcp_rate:.0f} "
        f"tcp_server_cpu_ms={tcp_server_ms:.2f} "
        f"tcp_crypto_share={2 * (seal_ms + open_ms) / tcp_p50:.2f} "
        f"tcp_plain_roundtrip_ms_p50={plain_p50:.2f} tcp_hmac_pushes_per_s={hmac_rate:.0f} "
        f"tcp_speedup_vs_hmac={tcp_rate / hmac_rate:.2f} tcp_bf16_roundtrip_ms_p50={bf16_p50:.2f} "
        f"tcp_bf16_speedup_vs_hmac={min(bf16_rates.values()) / hmac_rate:.2f}"
    )


def measure(
    src: np.ndarray, shared: bool, protocol: str, dtype: str, roundtrips: int, seconds: float
) -> tuple[float, float, float, dict[int, float]]:
    """Round-trip p50 and p99 (ms), the server's CPU ms per round trip, and pushes/s for 2
    and 4 clients, over one transport."""
    _use(protocol)
    try:
        with ParameterServer(src, secret=SECRET) as server:
            ctx = mp.get_context("spawn")
            out = ctx.Queue()
            proc = ctx.Process(
                target=_roundtrips, args=(server.address, roundtrips, shared, protocol, dtype, out)
            )
            cpu = time.process_time()  # this process is the server's: its CPU per exchange
            proc.start()
            times = np.array(out.get(timeout=300)) * 1000
            server_ms = (time.process_time() - cpu) * 1000 / (roundtrips + 11)
            proc.join()
            rates = {
                k: pushes_per_s(server.address, k, shared, protocol, dtype, seconds) for k in (2, 4)
            }
    finally:
        _use("aes-gcm")
    return float(np.percentile(times, 50)), float(np.percentile(times, 99)), server_ms, rates


if __name__ == "__main__":
    main()
