"""Which processes of this machine carry a string in their command line or environment
(``/proc``: the pid space is shared by every network namespace, so this sees every
simulated host)."""

from __future__ import annotations

import threading
from pathlib import Path


def carriers(secret: str, *, environment: bool = True) -> dict[int, str]:
    """Pid to where (``cmdline`` or ``environ``) and the command, of each process carrying
    ``secret``."""
    needle, found = secret.encode(), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            where = ["cmdline"] if needle in cmdline else []
            if environment and needle in (entry / "environ").read_bytes():
                where.append("environ")
        except OSError:  # it exited meanwhile
            continue
        if where:
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            # An executor's Python daemon outlives a killed executor (then its parent is init).
            tag = (
                " [executor]"
                if under(int(entry.name), "CoarseGrainedExecutorBackend", "pyspark.daemon")
                else ""
            )
            found[int(entry.name)] = f"{'+'.join(where)}{tag}: {command}"
    return found


def under(pid: int, *markers: str) -> bool:
    """Whether ``pid`` or one of its ancestors has one of ``markers`` in its command line."""
    for _ in range(64):  # deeper than any process tree here
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if any(m.encode() in cmdline for m in markers):
                return True
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid <= 1:
            return False
    return False


class Watch:
    """Scan every ``interval_s`` in a thread until stopped; ``found`` gathers every carrier seen."""

    def __init__(self, secret: str, interval_s: float = 0.5) -> None:
        self.secret, self.interval_s = secret, interval_s
        self.found: dict[int, str] = {}
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.found.update(carriers(self.secret))
            self.scans += 1

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
