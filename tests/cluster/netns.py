"""Hosts for multi-host tests: network namespaces joined by a bridge, created and removed
by the test (root only).

Each host is a namespace with its own loopback and one interface on a private /24; the
bridge lives in a namespace of its own, so the root namespace holds no address of the
subnet and has no route to it. Every process that uses a host's address runs inside
that host (:meth:`Hosts.run`, ``ip netns exec``): nothing connects from the root
namespace to a 10.x address, where the traffic would leave the machine.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from pathlib import Path


def missing() -> str | None:
    """Why these tests cannot run here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"st{secrets.token_hex(2)}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if made.returncode != 0:  # a container without CAP_SYS_ADMIN
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class Hosts:
    """Namespaces named after ``names`` on 10.<x>.<y>.0/24 (host i at .i+1), each with
    ``/etc/netns/<namespace>/hosts`` naming every host, as a cluster's DNS would.

    Example (root only)::

        with Hosts(["driver", "worker-a"]) as hosts:
            subprocess.run([*hosts.run("worker-a"), "ping", "-c1", hosts.address["driver"]])
    """

    def __init__(self, names: list[str]) -> None:
        tag = secrets.token_hex(2)
        self.namespaces = {name: f"st{tag}-{i}" for i, name in enumerate(names)}
        self._switch = f"st{tag}-sw"
        net = f"10.{200 + int(tag[:2], 16) % 50}.{int(tag[2:], 16)}"
        self.address = {name: f"{net}.{i + 1}" for i, name in enumerate(names)}
        self._created: list[str] = []

    def run(self, name: str) -> list[str]:
        """The command prefix that runs a program on host ``name``."""
        return ["ip", "netns", "exec", self.namespaces[name]]

    def up(self) -> Hosts:
        _ip("netns", "add", self._switch)
        self._created.append(self._switch)
        _ip("-n", self._switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self._switch, "link", "set", "br0", "up")
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in self.address.items())
        for i, (name, ns) in enumerate(self.namespaces.items()):
            _ip("netns", "add", ns)
            self._created.append(ns)
            # Both ends are created in their namespaces: the root namespace never holds them.
            _ip(
                "link",
                "add",
                "eth0",
                "netns",
                ns,
                "type",
                "veth",
                "peer",
                "name",
                f"port{i}",
                "netns",
                self._switch,
            )
            _ip("-n", self._switch, "link", "set", f"port{i}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.address[name]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            folder = Path("/etc/netns") / ns
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(hosts)
        return self

    def down(self) -> None:
        """Remove every namespace (their interfaces go with them) and hosts file."""
        for ns in reversed(self._created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        self._created.clear()

    def __enter__(self) -> Hosts:
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *_: object) -> None:
        self.down()
