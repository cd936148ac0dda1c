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
        ok = (refused == 15 and stats["refused"].get("nonfinite") == 15 and server.clock == len(pushes)
              and bool(np.isfinite(server.weights()).all()))
    return {"survived": ok, "refused": refused, "loop_pushes": len(pushes)}


def slow_ps_clients(folder: Path, args: Any) -> dict[str, Any]:
    from pipeline.train.ps import ParameterServer, transport

    stop, pushes = threading.Event(), []
    with ParameterServer(np.zeros(100_000, np.float32), secret=b"chaos") as server:
        loop = _training_loop(server, stop, pushes)
        slow = [socket.create_connection(server.address, timeout=5) for _ in range(transport.MAX_UNAUTHENTICATED)]
        before, started = len(pushes), time.monotonic()
        for _ in range(int(transport.HANDSHAKE_TIMEOUT_S) + 3):  # bounded: the deadline and a margin
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
    ok = refused.get("handshake", 0) == transport.MAX_UNAUTHENTICATED and rate_during > 1
    return {"survived": ok, "refused": refused, "loop_pushes_per_s": round(rate_during, 1)}
