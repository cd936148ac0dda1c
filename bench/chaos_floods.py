"""Chaos of issue 39 against a live run (``bench/chaos.py`` runs these): floods of idle and
trickling connections at its parameter server, slow and bursting clients, long strings,
a cross-origin POST and a rebinding Host at its model server, and a long stationary run
that must not stop itself.

Every loop here is bounded by a count or a deadline; every socket opened is closed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

BODY = json.dumps({"instances": [[0.5] * 28]}).encode()
ROOT = Path(__file__).resolve().parent.parent


def trained(metrics_url: str) -> float:
    """The run's trained records now, from its /metrics."""
    body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()  # noqa: S310 (loopback)
    for line in body.splitlines():
        if line.startswith("streamtrain_train_records_total"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def rate_over(metrics_url: str, seconds: float) -> float:
    """Records/s trained over the next ``seconds``."""
    start, t0 = trained(metrics_url), time.monotonic()
    time.sleep(seconds)
    return (trained(metrics_url) - start) / (time.monotonic() - t0)


def _hold(address: tuple[str, int], n: int, *, trickle: bool, seconds: float) -> dict[str, int]:
    """``n`` connections to ``address``, idle or sending a byte every 2 s, for ``seconds``;
    a closed one is opened again (an attacker's). Counts of what happened to them."""
    socks: list[socket.socket | None] = [None] * n
    opened = closed = 0
    deadline, tick = time.monotonic() + seconds, 0.0
    while time.monotonic() < deadline:  # bounded by the deadline
        for i in range(n):
            if socks[i] is None:
                with contextlib.suppress(OSError):
                    socks[i] = socket.create_connection(address, timeout=5)
                    opened += 1
        if trickle and time.monotonic() - tick >= 2:
            tick = time.monotonic()
            for i, s in enumerate(socks):
                if s is not None:
                    try:
                        s.send(b"x")
                    except OSError:
                        s.close()
                        socks[i] = None
                        closed += 1
        time.sleep(0.5)
    for s in socks:
        if s is not None:
            s.close()
    return {"opened": opened, "closed_by_server": closed}


def ps_floods(live: Any, seconds: float = 30) -> dict[str, Any]:
    """An idle flood and then a trickling flood, 500 connections each, at the live run's
    parameter server, each for ``seconds`` (bounded, under 120 s); the run's trained
    records/s during each against an undisturbed window before them."""
    text = live.wait("first micro-batch trained")
    host, port = _find(text, r"parameter server at ([\d.]+:\d+)").split(":")
    metrics = _find(text, r"metrics at (http://\S+)")
    # The first batches catch up with what the producer sent during start-up: measure the
    # undisturbed rate once the run keeps pace with it, as the flooded ones are.
    time.sleep(20)
    alone = rate_over(metrics, seconds)
    rates, floods = {}, {}
    for kind in ("idle", "trickling"):
        result: dict[str, Any] = {}
        t = threading.Thread(
            target=lambda r=result, k=kind: r.update(
                _hold((host, int(port)), 500, trickle=k == "trickling", seconds=seconds + 4)
            )
        )
        t.start()
        time.sleep(2)  # the flood is up
        rates[kind] = rate_over(metrics, seconds)
        t.join(seconds + 60)
        floods[kind] = result
    ratio = min(rates.values()) / alone if alone else 0.0
    return {
        "survived": ratio >= 0.8 and live.trainer.p.poll() is None,
        "records_per_s_alone": round(alone),
        "records_per_s_flooded": {k: round(v) for k, v in rates.items()},
        "ratio": round(ratio, 2),
        "floods": floods,
    }


def _pid_listening(port: int) -> int | None:
    """The pid of the process listening on ``port`` (loopback), from /proc."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                    inodes.add(fields[9])
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if (
                    os.readlink(f"/proc/{pid}/fd/{fd}").removeprefix("socket:[").rstrip("]")
                    in inodes
                ):
                    return int(pid)
    return None


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _normal(port: int, path: str, seconds: float, answers: list[int]) -> None:
    """A normal client: one request a second, a new connection each, for ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # bounded by the deadline
        started = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        try:
            conn.request("POST", path, BODY, {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            answers.append(response.status)
        except (OSError, http.client.HTTPException):
            answers.append(0)
        finally:
            conn.close()
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))


def serve_floods(live: Any, seconds: float = 40) -> dict[str, Any]:
    """At the live run's model server, beside a normal client asking once a second: 300
    slow clients trickling a head byte every 2 s and reconnecting when dropped, for
    ``seconds``; then three bursts of 600 connections; then eight 15 MB string bodies at
    once (the server's RSS must come back within 10%); a cross-origin form POST and a
    rebinding Host."""
    text = live.wait("serving predictions at")
    port = int(_find(text, r"serving predictions at http://127\.0\.0\.1:(\d+)/"))
    path = "/v1/models/higgs:predict"
    pid = _pid_listening(port)
    rss_start = _rss_mb(pid) if pid else 0.0
    answers: list[int] = []
    normal = threading.Thread(target=_normal, args=(port, path, seconds, answers))
    normal.start()
    slow = _hold(("127.0.0.1", port), 300, trickle=True, seconds=seconds)
    normal.join(seconds + 30)
    answered = sum(a == 200 for a in answers) / max(1, len(answers))
    held = []
    for _ in range(3):  # bursts of 600 at once
        burst = []
        for _ in range(600):
            with contextlib.suppress(OSError):
                burst.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(1.0)
        alive = 0
        for s in burst:
            s.setblocking(False)
            with contextlib.suppress(OSError):
                try:
                    s.recv(1)  # an answer (a 503, or a 408 as it made room), or the end: not held
                except BlockingIOError:
                    alive += 1  # silent and open: held by the server
            s.close()
        held.append(alive)
    big = b'{"instances": [["' + b"a" * (15 << 20) + b'"]]}'
    statuses: list[int] = []

    def post_big() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            conn.request("POST", path, big, {"Content-Type": "application/json"})
            statuses.append(conn.getresponse().status)
        except (OSError, http.client.HTTPException):
            statuses.append(0)
        finally:
            conn.close()

    threads = [threading.Thread(target=post_big) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    time.sleep(2)
    rss_end = _rss_mb(pid) if pid else 0.0
    form = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    form.request(
        "POST",
        path,
        b"instances=1",
        {"Content-Type": "text/plain", "Origin": "http://evil.example"},
    )
    cross_site = form.getresponse().status
    form.close()
    rebound = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    rebound.request("GET", "/v1/models/higgs", headers={"Host": "evil.example"})
    rebinding = rebound.getresponse().status
    rebound.close()
    rss_ok = pid is not None and rss_end <= rss_start * 1.1
    ok = (
        answered >= 0.95
        and max(held) <= 256
        and set(statuses) <= {413, 503}
        and 413 in statuses
        and rss_ok
        and cross_site == 415
        and rebinding == 421
    )
    return {
        "survived": ok,
        "normal_answered": round(answered, 3),
        "normal_requests": len(answers),
        "slow_clients": slow,
        "burst_held_open": held,
        "string_bodies": statuses,
        "serve_rss_mb": [round(rss_start), round(rss_end)],
        "cross_site_post": cross_site,
        "rebinding_host": rebinding,
    }


def stationary(folder: Path, minutes: float) -> dict[str, Any]:
    """A HIGGS run replaying 100 epochs at 600 records/s for ``minutes``, nothing wrong: it
    must not stop itself (the collapse check on a 500-record held-out split)."""
    out = folder / "run"
    with open(folder / "stationary.out", "w") as log:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "run",
                "--dataset",
                "higgs",
                "--epochs",
                "100",
                "--rate",
                "600",
                "--eval-every",
                "5",
                "--timeout",
                str(int(minutes * 60)),
                "--out",
                str(out),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            timeout=minutes * 60 + 600,
        )
    report = (
        json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    )
    text = (folder / "stationary.out").read_text(errors="replace")
    stopped = str(report.get("stopped_because", ""))
    return {
        "survived": done.returncode == 0
        and "collapsed" not in text
        and stopped.startswith(("limit", "all produced")),
        "exit": done.returncode,
        "stopped_because": report.get("stopped_because"),
        "trained": report.get("trained_records"),
        "tracebacks": text.count("Traceback"),
    }


def _find(text: str, pattern: str) -> str:
    import re

    found = re.findall(pattern, text)
    if not found:
        raise RuntimeError(f"no {pattern!r} in the log")
    return str(found[-1])
