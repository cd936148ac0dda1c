"""docker-compose.yml's cluster profile rehearsed without a container engine (the default
stack runs in containers: tests/deploy/test_containers.py): each service's own command and
configuration run as processes, each service in a network namespace of its name, where the
other services' names resolve as Compose's DNS would resolve them (``ip netns exec`` mounts
``/etc/netns/<name>/hosts``). The embedded broker stands in for the Kafka image; Grafana
(no binary here) is left out, its provisioning checked by tests/test_deploy.py. The test
process reads files, and asks Prometheus from inside its namespace."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from producers import datasets
from tests.cluster import multihost, netns
from tests.conftest import ROOT, _need

_CANNOT = netns.missing()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_CANNOT is not None, reason=_CANNOT or "")]
LEFT_OUT = {"grafana"}


def _compose(*profile: str) -> dict[str, Any]:
    import compose

    binary = Path(compose.__file__).parent / "docker-compose"
    done = subprocess.run(
        [str(binary), "-f", "docker-compose.yml", *profile, "config", "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    model: dict[str, Any] = json.loads(done.stdout)
    return model


def _image_env() -> dict[str, str]:
    """The ENV the project's Dockerfile sets (its services run with it), but the image's
    JAVA_HOME (this machine's Java runs them)."""
    text = (ROOT / "deploy" / "Dockerfile").read_text().replace("\\\n", " ")
    env = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(re.findall(r"(\w+)=(\S+)", line))
    env.pop("JAVA_HOME", None)
    return env


def _order(services: dict[str, Any]) -> list[str]:
    """Service names, each after those it depends on."""
    done: list[str] = []

    def visit(name: str) -> None:
        if name not in done:
            for dep in services[name].get("depends_on") or {}:
                visit(dep)
            done.append(name)

    for name in sorted(services):
        visit(name)
    return done


class Stack:
    """A compose model's services run as processes, one namespace each."""

    def __init__(
        self, model: dict[str, Any], folder: Path, hosts: netns.Hosts, env: dict[str, str]
    ) -> None:
        self.services = {n: s for n, s in model["services"].items() if n not in LEFT_OUT}
        self.folder, self.hosts, self.extra_env = folder, hosts, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        cache = folder / "cache"
        cache.mkdir()
        (cache / "mnist.npz").symlink_to(datasets.mnist.fetch())
        self.base_env = {
            **os.environ,
            **_image_env(),
            "PYTHONPATH": str(ROOT),
            "STREAMTRAIN_CACHE_DIR": str(cache),
            "STREAMTRAIN_JVM_CLASS_CACHE": "false",
        }

    def path(self, service: str, value: str) -> str:
        """``value`` (``PATH`` or ``--flag=PATH``) with a mount's path inside the container
        replaced by its folder here."""
        mounts = {}
        for mount in self.services[service].get("volumes", []):
            source = (
                mount["source"]
                if mount["type"] == "bind"
                else str(self.folder / "volumes" / mount["source"])
            )
            Path(source).mkdir(parents=True, exist_ok=True)
            mounts[mount["target"]] = source
        if not mounts:
            return value
        pattern = "|".join(re.escape(t) for t in sorted(mounts, key=len, reverse=True))
        return re.sub(rf"(^|=)({pattern})(?=/|$)", lambda m: m.group(1) + mounts[m.group(2)], value)

    def command(self, name: str) -> list[str]:
        service, address = self.services[name], self.hosts.address[name]
        if name == "kafka":  # the embedded broker stands in for the Kafka image
            return [sys.executable, "-m", "pipeline", "broker", "--host", address, "--port", "9092"]
        args = [self.path(name, a) for a in service.get("command") or []]
        if "build" in service:  # the project's image: its entrypoint is streamtrain
            return [sys.executable, "-m", "pipeline", *args]
        if service["image"].startswith("prom/prometheus"):
            return [_need("prometheus"), *args, f"--web.listen-address={address}:9090"]
        raise AssertionError(f"no way to rehearse service {name} ({service['image']})")

    def start(self, name: str) -> None:
        service = self.services[name]
        env = {
            **self.base_env,
            **{k: self.path(name, v) for k, v in (service.get("environment") or {}).items()},
            **self.extra_env,
        }
        with open(self.folder / f"{name}.log", "wb") as f:
            self.procs[name] = subprocess.Popen(
                [*self.hosts.run(name), *self.command(name)],
                cwd=ROOT,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        conditions = {
            dep.get("condition")
            for s in self.services.values()
            for d, dep in (s.get("depends_on") or {}).items()
            if d == name
        }
        if "service_completed_successfully" in conditions:
            assert self.procs[name].wait(120) == 0, self.log(name)
        elif name == "kafka":
            multihost.wait_for(self.folder / "kafka.log", "Ctrl-C stops it", self.procs[name], 60)

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")[-3000:]

    def prometheus_targets(self) -> list[dict[str, Any]]:
        """Prometheus's active targets, asked from inside its namespace."""
        url = f"http://{self.hosts.address['prometheus']}:9090/api/v1/targets"
        done = subprocess.run(
            [
                *self.hosts.run("prometheus"),
                sys.executable,
                "-c",
                f"import urllib.request; print(urllib.request.urlopen({url!r}, "
                "timeout=5).read().decode())",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            return []
        targets: list[dict[str, Any]] = json.loads(done.stdout)["data"]["activeTargets"]
        return targets

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            multihost.stop(proc)


# The default stack runs in containers (tests/deploy/test_containers.py); the cluster
# profile's master and workers are rehearsed here.
@pytest.fixture(params=["cluster"])
def stack(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stack]:
    profile = ["--profile", "cluster"] if request.param == "cluster" else []
    model = _compose(*profile)
    env = {"STREAMTRAIN_MASTER": "spark://spark-master:7077"} if request.param == "cluster" else {}
    with netns.Hosts(sorted(n for n in model["services"] if n not in LEFT_OUT)) as hosts:
        s = Stack(model, tmp_path, hosts, env)
        try:
            for name in _order(s.services):
                s.start(name)
            yield s
        finally:
            s.stop()


def test_the_stack_trains_and_prometheus_finds_every_target_up(stack: Stack) -> None:
    """Proves: every service of the compose file's cluster profile, run with its own command
    and configuration where its name and its peers' names resolve as in Compose: the
    trainer trains from the producer's topic on the profile's Spark master and workers, over
    TCP, and Prometheus, with deploy/prometheus/, finds every scrape target up.

    Slow: the profile's services start one after another in their dependency order, each a
    process in a network namespace of its own (Apache Kafka's broker, the secrets job, Spark's
    master and two workers, the replay producer, the trainer with its Spark session and two
    TensorFlow workers, Prometheus), and the test then waits, up to 300 s, for the trainer's
    first micro-batch and a scrape of every target: the whole stack is what it rehearses."""
    rows_file = Path(stack.path("trainer", "/runs/mnist")) / "batches.jsonl"
    deadline = time.monotonic() + 300
    targets: list[dict[str, Any]] = []
    while True:
        for name, proc in stack.procs.items():
            assert proc.poll() is None or name == "spark-secret", (
                f"{name} exited: {stack.log(name)}"
            )
        targets = stack.prometheus_targets()
        up = bool(targets) and all(t["health"] == "up" for t in targets)
        if up and rows_file.is_file() and rows_file.read_text().strip():
            break
        assert time.monotonic() < deadline, (
            f"trained: {rows_file.is_file()}, targets: "
            f"{[(t['scrapeUrl'], t['health'], t['lastError']) for t in targets]}\n"
            f"{stack.log('trainer')}"
        )
        time.sleep(1)
    assert {t["labels"]["job"] for t in targets} == {
        "streamtrain",
        "streamtrain-serve",
        "streamtrain-producer",
    }
    row = json.loads(rows_file.read_text().splitlines()[0])
    assert row["trained"] > 0 and all(t["applied"] == t["steps"] for t in row["tasks"])
    assert {t["transport"] for t in row["tasks"]} == {"tcp"}
