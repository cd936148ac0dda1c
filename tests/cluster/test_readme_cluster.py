"""The README's cluster section followed as written (issue 29): its fenced commands, read
from the README, run on three network-namespace hosts in its addresses' places (10.0.0.1:
the driver with Kafka and the master; 10.0.0.2 and, as "each worker's machine" says,
10.0.0.3: a worker each). The run trains over TCP and the report says so."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from producers import datasets
from tests.cluster import multihost, netns

ROOT = Path(__file__).resolve().parents[2]
_CANNOT = netns.missing()
#: What the test adds to the README's `run`, and only that: a short run on this machine's cores.
SHORT = ["--workers", "2", "--max-batches", "1", "--max-offsets-per-trigger", "1500", "--eval-every", "1"]


def readme_commands() -> list[list[str]]:
    """The commands of the fenced block under "When one machine is not enough", continuation
    lines joined, comments left out; each as argv with its ``VAR=value`` prefixes."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## When one machine is not enough", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    lines = re.sub(r"\\\n\s*", " ", block).splitlines()
    return [shlex.split(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_the_readme_names_the_broker_the_driver_address_and_closed_6066() -> None:
    commands = readme_commands()
    assert [c[0] for c in commands if "=" not in c[0]][:3] == ["streamtrain"] * 3
    assert next(c[1:4] for c in commands if "broker" in c) == ["broker", "--host", "10.0.0.1"]
    run = next(c for c in commands if "run" in c)
    assert "SPARK_LOCAL_IP=10.0.0.1" in run and run[run.index("--bootstrap") + 1] == "10.0.0.1:9092"
    assert "6066" in (ROOT / "README.md").read_text().split("## When one machine is not enough", 1)[1]


@pytest.mark.slow
@pytest.mark.skipif(_CANNOT is not None, reason=_CANNOT or "")
def test_the_readme_cluster_commands_run_as_written_on_three_hosts(tmp_path: Path) -> None:
    commands = readme_commands()
    with netns.Hosts(["driver", "worker-a", "worker-b"]) as hosts:
        where = {"10.0.0.1": "driver", "10.0.0.2": "worker-a", "10.0.0.3": "worker-b"}

        def place(argv: list[str], old: str, new: str) -> list[str]:
            return [a.replace(old, hosts.address[where[new]]) for a in argv]

        cache = tmp_path / "cache"
        cache.mkdir()
        (cache / "mnist.npz").symlink_to(datasets.mnist.fetch())
        base = {**os.environ, "STREAMTRAIN_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT),
                "STREAMTRAIN_JVM_CLASS_CACHE": "false"}
        started: list[subprocess.Popen[bytes]] = []

        def start(host: str, argv: list[str], name: str, ready: str | None) -> subprocess.Popen[bytes]:
            env = dict(base)
            while "=" in argv[0]:  # VAR=value prefixes, as the shell takes them
                key, _, value = argv.pop(0).partition("=")
                env[key] = value
            assert argv[0] == "streamtrain", argv
            log = tmp_path / f"{name}.log"
            with open(log, "wb") as f:
                proc = subprocess.Popen([*hosts.run(host), sys.executable, "-m", "pipeline", *argv[1:]], cwd=tmp_path,
                                        env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            started.append(proc)
            if ready:
                multihost.wait_for(log, ready, proc, 180)
            return proc

        try:
            for argv in commands:
                argv = [a.replace("10.0.0.1", hosts.address["driver"]) for a in argv]
                verb = next(a for a in argv if a != "streamtrain" and "=" not in a)
                if verb == "cluster-conf":
                    done = subprocess.run([sys.executable, "-m", "pipeline", *argv[1:]], cwd=tmp_path, env=base,
                                          capture_output=True, text=True, timeout=60)
                    assert done.returncode == 0, done.stderr
                elif verb == "broker":
                    start("driver", argv, "broker", "Ctrl-C stops it")
                elif verb == "spark-master":
                    start("driver", argv, "master", "I have been elected leader")
                elif verb == "spark-worker":
                    for worker, address in (("worker-a", "10.0.0.2"), ("worker-b", "10.0.0.3")):
                        start(worker, place(list(argv), "10.0.0.2", address), worker,
                              "Successfully registered with master")
                else:
                    assert verb == "run", argv
                    run = start("driver", [*argv, *SHORT, "--out", str(tmp_path / "run")], "run", None)
                    assert run.wait(600) == 0, (tmp_path / "run.log").read_text(errors="replace")[-4000:]
        finally:
            for proc in reversed(started):
                multihost.stop(proc)
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["trained_records"] > 0
    assert {t["transport"] for row in report["batches"] for t in row["tasks"]} == {"tcp"}
    assert (cache / "spark-work").is_dir()  # the workers' folders in the user's cache, as the README says
