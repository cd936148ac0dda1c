"""The compose stack in containers, driven as a user drives it: Podman runs the images that
deploy/standins/build.py builds (no registry here), podman-compose reads docker-compose.yml
and the override that swaps the stand-in images in. The test reads what a user reads: the
services' logs, the published ports on the host's loopback, the volumes' files."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

STANDINS = ROOT / "deploy" / "standins"
#: The ports docker-compose.yml publishes on the host's loopback (Grafana's is left out).
PUBLISHED = {"kafka": 9094, "trainer": 8501, "metrics": 9108, "prometheus": 9090}


def cannot_run() -> str | None:
    """Why Podman cannot start a container here; None when it can. Imports the base image
    first (debootstrap, no container needed; kept between runs), then starts one."""
    for tool in ("podman", "debootstrap"):
        if shutil.which(tool) is None:
            return f"no `{tool}` (tests/run.sh installs it as root on Debian)"
    if os.geteuid() != 0:
        return "the stand-ins' build and the stack need root (rootful Podman)"
    info = subprocess.run(["podman", "info"], capture_output=True, text=True, check=False)
    if info.returncode != 0:
        return f"podman cannot run here: {info.stderr.strip()[-300:]}"
    build = standins_build()
    os.environ["CONTAINERS_CONF"] = str(build.containers_conf())
    build.debian()  # a failure here (no route to Debian's archive) fails the test, loudly
    done = subprocess.run(
        ["podman", "run", "--rm", "--network", "none", build.DEBIAN, "true"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        return f"podman cannot start a container here: {done.stderr.strip()[-300:]}"
    return None


def standins_build() -> Any:
    """deploy/standins/build.py as a module (under a name of its own: not PyPA's `build`)."""
    import importlib.util

    path = STANDINS / "build.py"
    spec = importlib.util.spec_from_file_location("streamtrain_standins_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_images(report: Path) -> dict[str, Any]:
    """The stand-ins and the project's image (kept between runs on this machine)."""
    done = subprocess.run(
        [sys.executable, str(STANDINS / "build.py"), "--json", str(report)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=2400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    env_line = done.stdout.strip().splitlines()[-1]
    assert env_line.startswith("export CONTAINERS_CONF="), done.stdout
    os.environ["CONTAINERS_CONF"] = env_line.split("=", 1)[1]
    built: dict[str, Any] = json.loads(report.read_text())
    return built


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Stack:
    """One compose project: ``compose(...)`` runs podman-compose on it."""

    def __init__(self, project: str, files: list[str]) -> None:
        self.project, self.files = project, files

    def compose(self, *args: str, timeout: float = 600, check: bool = True) -> str:
        tool = Path(sys.executable).parent / "podman-compose"
        cmd = [str(tool), "-p", self.project]
        for f in self.files:
            cmd += ["-f", f]
        done = subprocess.run(
            [*cmd, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check:
            assert done.returncode == 0, f"podman-compose {' '.join(args)}:\n{done.stderr[-3000:]}"
        return done.stdout

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def logs(self, service: str, tail: int = 60, *, container: str | None = None) -> str:
        done = subprocess.run(
            ["podman", "logs", "--tail", str(tail), container or self.container(service)],
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout + done.stderr

    def names(self) -> list[str]:
        """The IDs of the stack's containers, running or not (none where Podman fails: the
        callers' own failure comes first)."""
        label = f"label=io.podman.compose.project={self.project}"
        try:
            done = subprocess.run(
                ["podman", "ps", "-aq", "--filter", label],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return []
        return done.stdout.split()

    def failed(self) -> dict[str, int]:
        """The stack's containers that are down with a non-zero exit code, by name."""
        names = self.names()
        if not names:
            return {}
        try:
            states = subprocess.run(
                ["podman", "inspect", "--format", "{{.Name}} {{.State.Status}} {{.State.ExitCode}}",
                 *names],
                capture_output=True, text=True, timeout=60, check=False,
            ).stdout  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return {}
        down = (line.split() for line in states.splitlines() if len(line.split()) == 3)
        return {
            name: int(code)
            for name, status, code in down
            if status in ("exited", "stopped") and code.lstrip("-").isdigit() and code != "0"
        }

    def state(self, service: str) -> dict[str, Any]:
        done = subprocess.run(
            ["podman", "inspect", "--format", "{{json .State}}", self.container(service)],
            capture_output=True,
            text=True,
            check=False,
        )
        state: dict[str, Any] = json.loads(done.stdout) if done.returncode == 0 else {}
        return state

    def volume(self, name: str) -> Path:
        """A named volume's folder on the host (rootful Podman keeps it under its storage)."""
        done = subprocess.run(
            [
                "podman",
                "volume",
                "inspect",
                "--format",
                "{{.Mountpoint}}",
                f"{self.project}_{name}",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return Path(done.stdout.strip())

    def wait(self, predicate: Callable[[], Any], timeout_s: float, what: str, service: str) -> Any:
        """``predicate``'s first true value within ``timeout_s``; else fail with the
        service's log. A container of the stack that exited non-zero and stayed down for
        a minute (its restart policy did not bring it back) fails the wait at once, with its
        log: what it waits for may never come (CI waited 15 minutes on an exited producer)."""
        deadline = time.monotonic() + timeout_s
        down_since: dict[str, float] = {}
        checked = time.monotonic()
        while time.monotonic() < deadline:
            try:
                value = predicate()
            except OSError:
                value = None
            if value:
                return value
            if time.monotonic() - checked >= 10:
                checked = now = time.monotonic()
                failed = self.failed()
                down_since = {name: down_since.get(name, now) for name in failed}
                for name, since in down_since.items():
                    if now - since >= 60:
                        raise AssertionError(
                            f"{name} exited {failed[name]} and stayed down while waiting for "
                            f"{what}; its log ends:\n{self.logs('', 40, container=name)}\n"
                            f"{self.overview()}"
                        )
            time.sleep(1)
        raise AssertionError(
            f"timed out waiting for {what}; {service}'s log ends:\n{self.logs(service)}\n"
            f"{self.overview()}"
        )

    def overview(self) -> str:
        """What a failed wait needs beside the service's log: every container's state and
        restarts, what the compose network's DNS answers for Kafka inside the trainer (a
        stale or missing entry looks like a broker that does not answer), the log of every
        container that exited non-zero, Kafka's log end."""

        def run(*cmd: str) -> str:
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
            except (OSError, subprocess.TimeoutExpired) as e:  # the wait's own failure first
                return f"({cmd[1]} failed: {e})"
            return (done.stdout + done.stderr).strip()

        names = self.names()
        states = run(
            "podman", "inspect", "--format",
            "{{.Name}}: {{.State.Status}}, exit {{.State.ExitCode}}, restarts {{.RestartCount}}",
            *names,
        ) if names else "(none)"  # fmt: skip
        kafka = run("podman", "inspect", "--format", "{{json .NetworkSettings.Networks}}",
                    self.container("kafka"))  # fmt: skip
        dns = run("podman", "exec", self.container("trainer"), "getent", "ahosts", "kafka")
        exited = "".join(
            f"{name}, which exited {code}: its log ends:\n{self.logs('', 30, container=name)}\n"
            for name, code in self.failed().items()
        )
        return (
            f"containers:\n{states}\nkafka's networks: {kafka}\n"
            f"`getent ahosts kafka` in the trainer: {dns or '(no answer)'}\n"
            f"{exited}kafka's log ends:\n{self.logs('kafka', tail=20)}"
        )

    def up(self) -> None:
        """`up -d`, Kafka and the secrets first: podman-compose on Podman 4.3 cannot honor
        depends_on's conditions (it warns, and starts every service at once) and Podman runs
        no healthcheck without systemd, so this waits as Compose would: until Kafka's own
        healthcheck (run by `podman healthcheck run`) passes and the secrets are written."""
        self.compose("up", "-d", "kafka", "spark-secret")

        def ready() -> bool:
            secrets = self.state("spark-secret")
            done = secrets.get("Status") == "exited" and secrets.get("ExitCode") == 0
            return done and self.healthy("kafka")

        self.wait(ready, 300, "Kafka healthy and the secrets written", "kafka")
        self.compose("up", "-d")

    def healthy(self, service: str) -> bool:
        """The service's own healthcheck, run now (Podman runs none without systemd)."""
        done = subprocess.run(
            ["podman", "healthcheck", "run", self.container(service)],
            capture_output=True,
            check=False,
        )
        return done.returncode == 0

    def down(self, keep_volumes: bool = False) -> None:
        """`down` (with `-v` unless ``keep_volumes``), and the anonymous volumes of the
        images' VOLUME lines (apache/kafka declares three), which down leaves behind."""
        names = self.names()
        mounts = subprocess.run(
            ["podman", "inspect", "--format", "{{range .Mounts}}{{.Name}} {{end}}", *names],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.split()
        volumes = [] if keep_volumes else ["-v"]
        # The trainer's grace (stop_grace_period) to finish its batch and write its report.
        self.compose("down", *volumes, "-t", "90", timeout=400, check=keep_volumes)
        anonymous = [m for m in mounts if len(m) == 64 and not m.startswith(self.project)]
        if names and anonymous:
            subprocess.run(["podman", "volume", "rm", "-f", *anonymous], capture_output=True)


def http(url: str, body: bytes | None = None, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
