"""What a Spark standalone master says of its cluster: its state, its workers and their
cores, read from the master's web UI (``/json/``), which listens on the master's loopback
(reach it there, or through an SSH tunnel to it)."""

from __future__ import annotations

import json
import socket
import urllib.request
from typing import Any

from pipeline.cluster.security import master_host
from pipeline.errors import ConfigError


def webui_url(master: str, port: int = 8080) -> str:
    """Where the master's web UI answers from here: its loopback on the master's own machine
    (or the near end of an SSH tunnel), else its host (a UI opened with ``--webui-host``).

    >>> webui_url("spark://127.0.0.1:7077")
    'http://127.0.0.1:8080'
    """
    host = master_host(master) or "127.0.0.1"
    return f"http://{'127.0.0.1' if _here(host) else host}:{port}"


def _here(host: str) -> bool:
    """Whether ``host`` is an address of this machine (it can be bound here)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((socket.gethostbyname(host), 0))
        return True
    except OSError:
        return False


def read(url: str, *, timeout_s: float = 3.0) -> dict[str, Any]:
    """The master's state as its web UI gives it; OSError or ValueError if it cannot be read."""
    with urllib.request.urlopen(f"{url.rstrip('/')}/json/", timeout=timeout_s) as r:
        state = json.load(r)
    if not isinstance(state, dict):
        raise ValueError("not a master's state")
    return state


def describe(master: str, url: str) -> list[str]:
    """Lines that say the master's state and each registered worker's address and cores.

    Raises:
        ConfigError: the UI cannot be read, or it is another master's.
    """
    try:
        state = read(url)
    except (OSError, ValueError) as e:
        raise ConfigError(
            f"Cannot read the master's web UI at {url} ({e}). Run this on the master's machine, or "
            f"through an SSH tunnel to it (ssh -N -L 8080:127.0.0.1:8080 MASTER_HOST), or pass "
            "--webui URL."
        ) from None
    if state.get("url") != master:
        raise ConfigError(
            f"Expected the web UI of {master}. Received: {url} serves {state.get('url')!r}. Pass "
            "--webui URL of that master's UI."
        )
    return lines(state)


def lines(state: dict[str, Any]) -> list[str]:
    """The master's state and one line per worker.

    >>> print(
    ...     "\\n".join(
    ...         lines(
    ...             {
    ...                 "url": "spark://10.0.0.1:7077",
    ...                 "status": "ALIVE",
    ...                 "aliveworkers": 1,
    ...                 "cores": 4,
    ...                 "coresused": 1,
    ...                 "activeapps": [{}],
    ...                 "workers": [
    ...                     {
    ...                         "host": "10.0.0.2",
    ...                         "port": 41234,
    ...                         "state": "ALIVE",
    ...                         "cores": 4,
    ...                         "coresused": 1,
    ...                         "memory": 8192,
    ...                     }
    ...                 ],
    ...             }
    ...         )
    ...     )
    ... )
    spark://10.0.0.1:7077: ALIVE, 1 worker alive with 4 cores (1 in use), 1 application running
      10.0.0.2:41234  ALIVE  4 cores (1 in use), 8.0 GiB for executors
    """
    alive = int(state.get("aliveworkers", 0))
    apps = len(state.get("activeapps", []))
    out = [
        f"{state.get('url')}: {state.get('status')}, {alive} worker{'s' * (alive != 1)} alive with "
        f"{state.get('cores', 0)} cores ({state.get('coresused', 0)} in use), {apps} application"
        f"{'s' * (apps != 1)} running"
    ]
    for w in state.get("workers", []):
        out.append(
            f"  {w.get('host')}:{w.get('port')}  {w.get('state')}  {w.get('cores')} cores "
            f"({w.get('coresused', 0)} in use), {int(w.get('memory', 0)) / 1024:.1f} GiB for "
            "executors"
        )
    return out
