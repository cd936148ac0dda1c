"""Chaos against the parameter server (``bench/chaos.py`` runs these): a server in this
process under a training loop (a worker pushing and pulling as fast as it can), and
hostile peers beside it. Each returns whether the loop went on as specified."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np


def _training_loop(server: Any, stop: threading.Event, pushes: list[int]) -> threading.Thread:
    from pipeline.train.ps import Client

    def loop() -> None:
        with Client(server.address, secret=b"chaos", worker=0, size=server.size) as c:
            c.pull()
            for _ in range(100_000):  # bounded
                if stop.is_set():
                    return
                c.push_pull(np.full(server.size, 1e-3, np.float32))
                pushes.append(1)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    return t


def poison_update(folder: Path, args: Any) -> dict[str, Any]:
    from pipeline.train.ps import Client, ParameterServer, ProtocolError

    stop, pushes = threading.Event(), []
    with ParameterServer(np.zeros(100_000, np.float32), secret=b"chaos") as server:
        loop = _training_loop(server, stop, pushes)
        refused = 0
        for poison in [np.nan, np.inf, 3e38] * 5:
            bad = np.zeros(server.size, np.float32)
            bad[7] = poison
            with Client(server.address, secret=b"chaos", worker=1, size=server.size) as c:
                c.pull()
                try:
                    c.push(bad)
                except ProtocolError:
                    refused += 1
        stop.set()
        loop.join(30)
        stats = server.stats()
        ok = (
            refused == 15
            and stats["refused"].get("nonfinite") == 15
            and server.clock == len(pushes)
            and bool(np.isfinite(server.weights()).all())
        )
    return {"survived": ok, "refused": refused, "loop_pushes": len(pushes)}


def slow_ps_clients(folder: Path, args: Any) -> dict[str, Any]:
    """300 peers trickle their handshake a byte a second: each newcomer past the handshake
    budget evicts the oldest, the budget's last share is dropped at its deadline, and the
    loop keeps its pace."""
    from pipeline.train.ps import ParameterServer, transport

    stop, pushes = threading.Event(), []
    with ParameterServer(np.zeros(100_000, np.float32), secret=b"chaos") as server:
        loop = _training_loop(server, stop, pushes)
        time.sleep(1)
        alone = len(pushes)
        slow = []
        for _ in range(300):
            with contextlib.suppress(OSError):  # a refused peer may be reset as it connects
                slow.append(socket.create_connection(server.address, timeout=5))
        before, started = len(pushes), time.monotonic()
        for _ in range(
            int(transport.HANDSHAKE_TIMEOUT_S) + 3
        ):  # bounded: the deadline and a margin
            for s in slow:
                with contextlib.suppress(OSError):  # dropped at its deadline already
                    s.send(b"x")
            time.sleep(1)
        rate_during = (len(pushes) - before) / (time.monotonic() - started)
        stop.set()
        loop.join(30)
        refused = server.stats()["refused"]
        for s in slow:
            s.close()
    dropped = refused.get("handshake", 0)
    ok = (
        dropped == transport.MAX_UNAUTHENTICATED
        and dropped + refused.get("evicted", 0) >= 300
        and rate_during > 0.5 * alone
    )
    return {
        "survived": ok,
        "refused": refused,
        "loop_pushes_per_s_alone": alone,
        "loop_pushes_per_s": round(rate_during, 1),
    }


def worker_flood(folder: Path, args: Any) -> dict[str, Any]:
    """Authenticated peers (a worker holding the secret) open every connection they may and
    claim more worker ids than the server tracks: connections past the cap are refused as busy, the
    server's per-worker tables stay bounded, its memory with them, and the loop goes on."""
    import resource

    from pipeline.train.ps import Client, ParameterServer, ProtocolError, transport
    from pipeline.train.ps.core import MAX_WORKER_IDS

    stop, pushes = threading.Event(), []
    with ParameterServer(np.zeros(100_000, np.float32), secret=b"chaos") as server:
        loop = _training_loop(server, stop, pushes)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        held, busy = [], 0
        for worker in range(1, transport.MAX_CONNECTIONS + 20):  # the cap and 20 more at once
            c = Client(
                server.address,
                secret=b"chaos",
                worker=worker,
                size=server.size,
                shared_memory=False,
            )
            try:
                c.pull()
                held.append(c)
            except (ProtocolError, OSError):
                busy += 1
                c.close()
        for c in held:
            c.close()
        claimed, deadline = 0, time.monotonic() + 90
        for w in range(1_000, 1_000 + MAX_WORKER_IDS + 2_000):  # bounded: past the id table's size
            if time.monotonic() > deadline:
                break
            with Client(
                server.address, secret=b"chaos", worker=w, size=server.size, shared_memory=False
            ) as c:
                c.pull()
            claimed += 1
        stop.set()
        loop.join(30)
        stats = server.stats()
        rss_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    ok = (
        busy >= 19
        and stats["workers"] <= MAX_WORKER_IDS
        and stats.get("pulled_copies", 0) <= 1
        and rss_mb < 500
    )
    return {
        "survived": ok,
        "busy": busy,
        "ids_claimed": claimed,
        "workers_tracked": stats["workers"],
        "pulled_copies": stats.get("pulled_copies"),
        "rss_growth_mb": round(rss_mb),
        "loop_pushes": len(pushes),
    }
