"""Chaos against a live run's model server (``bench/chaos.py`` runs these): slow clients
holding connections beside normal ones, a burst of connections, and every answer's
``X-Weights-Age-Seconds`` against the run's ``--serve-max-age``."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from typing import Any

BODY = json.dumps({"instances": [[0.5] * 28]}).encode()


def _ask(conn: http.client.HTTPConnection, path: str) -> tuple[int, float | None]:
    conn.request("POST", path, BODY, {"Content-Type": "application/json"})
    answer = conn.getresponse()
    answer.read()
    age = answer.getheader("X-Weights-Age-Seconds")
    return answer.status, float(age) if age is not None else None


def load(port: int, *, model: str, max_age_s: float, seconds: float = 15) -> dict[str, Any]:
    """64 clients trickling a request head a byte a second for ``seconds`` while a normal
    client asks in a loop; then 20 connections at once asking 10 times each. Survived: the
    normal client is answered, no connection of the burst is reset or left unanswered, and
    no answer carries weights older than ``max_age_s``."""
    path = f"/v1/models/{model}:predict"
    slow = []
    for _ in range(64):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(f"POST {path} HTTP/1.1\r\n".encode())
        slow.append(s)
    statuses: dict[str, int] = {}
    ages: list[float] = []
    lock = threading.Lock()

    def count(status: int, age: float | None) -> None:
        with lock:
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            if age is not None and status == 200:
                ages.append(age)

    normal = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    deadline, tick = time.monotonic() + seconds, time.monotonic()
    while time.monotonic() < deadline:  # bounded by the deadline
        try:
            count(*_ask(normal, path))
        except (OSError, http.client.HTTPException):
            count(0, None)
            normal.close()
            normal = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
        if time.monotonic() - tick >= 1:  # the slow clients' next byte
            tick = time.monotonic()
            for s in slow:
                with contextlib.suppress(OSError):  # dropped at the server's head deadline
                    s.send(b"X")
    normal.close()
    during = dict(statuses)
    for s in slow:
        s.close()
    statuses.clear()
    failures: list[str] = []

    def burst(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            for _ in range(10):
                count(*_ask(conn, path))
        except (OSError, http.client.HTTPException) as e:
            with lock:
                failures.append(f"connection {i}: {type(e).__name__}")
        finally:
            conn.close()

    threads = [threading.Thread(target=burst, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    over = [a for a in ages if a > max_age_s]
    ok = during.get("200", 0) > 0 and not failures and sum(statuses.values()) == 200 and not over
    return {
        "survived": ok,
        "during_slow_clients": during,
        "burst": dict(statuses),
        "burst_failures": failures[:5],
        "answers_over_max_age": len(over),
        "max_age_seen_s": max(ages, default=None),
    }
