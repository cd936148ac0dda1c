"""The cluster guide (docs/cluster.md) followed as written (issues 29 and 43): its fenced
commands, read through tests/docblocks.py, run on three network-namespace hosts in its addresses'
places (10.0.0.1: the driver with Kafka and the master; 10.0.0.2 and, as "each worker's machine"
says, 10.0.0.3: a worker each), as `streamtrain` found on PATH. Each daemon is waited for by
the "ready at" line the guide names, `cluster-status` lists both workers and their cores,
the web UIs are closed to the other hosts, and the run trains over TCP with the driver on
the fixed port `cluster-conf` wrote."""

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
from tests import docblocks
from tests.cluster import multihost, netns

ROOT = Path(__file__).resolve().parents[2]
#: The folder of this install's commands (the guide's /opt/streamtrain/bin).
BIN = Path(sys.executable).parent
_CANNOT = netns.missing()
#: What the test adds to the guide's `run`, and only that: a short run on this machine's cores.
SHORT = [
    "--workers",
    "2",
    "--max-batches",
    "1",
    "--max-offsets-per-trigger",
    "1500",
    "--eval-every",
    "1",
]


def guide_commands() -> list[list[str]]:
    """The commands of the cluster guide's block (tests/docblocks.py), continuation lines
    joined, comments left out; each as argv with its ``VAR=value`` prefixes."""
    return [
        shlex.split(line)
        for line in docblocks.commands(docblocks.run_block("docs/cluster.md", __file__))
    ]


def test_the_guide_names_the_broker_the_driver_address_and_closed_6066() -> None:
    commands = guide_commands()
    assert commands[0] == [
        "export",
        "PATH=/opt/streamtrain/bin:$PATH",
    ]  # the install's bin/, as it says above
    assert [c[0] for c in commands[1:] if "=" not in c[0]][:3] == ["streamtrain"] * 3
    assert ["streamtrain", "cluster-status", "spark://10.0.0.1:7077"] in commands
    assert next(c[1:4] for c in commands if "broker" in c) == ["broker", "--host", "10.0.0.1"]
    run = next(c for c in commands if "run" in c)
    assert "SPARK_LOCAL_IP=10.0.0.1" in run and run[run.index("--bootstrap") + 1] == "10.0.0.1:9092"
    assert "6066" in (ROOT / "docs" / "cluster.md").read_text()


@pytest.mark.slow
@pytest.mark.skipif(_CANNOT is not None, reason=_CANNOT or "")
def test_the_guides_cluster_commands_run_as_written_on_three_hosts(tmp_path: Path) -> None:
    """Proves: the cluster guide's commands, run as written on three network-namespace hosts,
    start a cluster whose web UIs are closed to other hosts, which `cluster-status` lists with
    its cores, and on which `run` trains over TCP through the driver's fixed port.

    Slow: everything the guide starts, each waited for by its ready line (Apache Kafka's broker,
    Spark's master and two workers, a JVM each, in three network namespaces), then a
    `streamtrain run` whose executors start on the workers for one micro-batch of 1,500 MNIST
    records; the guide's own commands leave no part to share with another test."""
    commands = guide_commands()
    with netns.Hosts(["driver", "worker-a", "worker-b"]) as hosts:
        where = {"10.0.0.1": "driver", "10.0.0.2": "worker-a", "10.0.0.3": "worker-b"}

        def place(argv: list[str], old: str, new: str) -> list[str]:
            return [a.replace(old, hosts.address[where[new]]) for a in argv]

        cache = tmp_path / "cache"
        cache.mkdir()
        (cache / "mnist.npz").symlink_to(datasets.mnist.fetch())
        base = {
            **os.environ,
            "STREAMTRAIN_CACHE_DIR": str(cache),
            "PYTHONPATH": str(ROOT),
            "STREAMTRAIN_JVM_CLASS_CACHE": "false",
        }
        started: list[subprocess.Popen[bytes]] = []

        def start(
            host: str, argv: list[str], name: str, ready: str | None
        ) -> subprocess.Popen[bytes]:
            env = dict(base)
            while "=" in argv[0]:  # VAR=value prefixes, as the shell takes them
                key, _, value = argv.pop(0).partition("=")
                env[key] = value
            assert argv[0] == "streamtrain", argv
            log = tmp_path / f"{name}.log"
            with open(log, "wb") as f:
                proc = subprocess.Popen(
                    [*hosts.run(host), *argv],
                    cwd=tmp_path,
                    env=env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started.append(proc)
            if ready:
                multihost.wait_for(log, ready, proc, 180)
            return proc

        try:
            for argv in commands:
                argv = [a.replace("10.0.0.1", hosts.address["driver"]) for a in argv]
                if argv[0] == "export":  # this install's bin/ in /opt/streamtrain/bin's place
                    key, _, value = argv[1].partition("=")
                    base[key] = value.replace("/opt/streamtrain/bin", str(BIN)).replace(
                        "$PATH", base["PATH"]
                    )
                    continue
                verb = next(a for a in argv if a != "streamtrain" and "=" not in a)
                if verb == "cluster-conf":
                    done = subprocess.run(
                        argv, cwd=tmp_path, env=base, capture_output=True, text=True, timeout=60
                    )
                    assert done.returncode == 0, done.stderr
                elif verb == "broker":
                    start("driver", argv, "broker", f"ready at {hosts.address['driver']}:9092")
                elif verb == "spark-master":
                    start(
                        "driver",
                        argv,
                        "master",
                        f"spark master ready at spark://{hosts.address['driver']}:7077",
                    )
                elif verb == "spark-worker":
                    for worker, address in (("worker-a", "10.0.0.2"), ("worker-b", "10.0.0.3")):
                        start(
                            worker,
                            place(list(argv), "10.0.0.2", address),
                            worker,
                            f"spark worker ready at {hosts.address[worker]}:",
                        )
                    _check_web_uis_closed(hosts)
                elif verb == "cluster-status":
                    done = subprocess.run(
                        [*hosts.run("driver"), *argv],
                        cwd=tmp_path,
                        env=base,
                        capture_output=True,
                        text=True,
                        timeout=60,
                    )
                    assert done.returncode == 0, done.stderr
                    status = done.stdout
                else:
                    assert verb == "run", argv
                    run = start(
                        "driver", [*argv, *SHORT, "--out", str(tmp_path / "run")], "run", None
                    )
                    assert run.wait(600) == 0, (tmp_path / "run.log").read_text(errors="replace")[
                        -4000:
                    ]
        finally:
            for proc in reversed(started):
                multihost.stop(proc)
    assert "2 workers alive with 8 cores" in status, status
    for worker in ("worker-a", "worker-b"):
        assert re.search(rf"{re.escape(hosts.address[worker])}:\d+  ALIVE  4 cores", status), status
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["trained_records"] > 0
    assert {t["transport"] for row in report["batches"] for t in row["tasks"]} == {"tcp"}
    assert (
        cache / "spark-work"
    ).is_dir()  # the workers' folders in the user's cache, as the guide says
    executors = " ".join(
        p.read_text(errors="replace") for p in (cache / "spark-work").glob("app-*/*/stderr")
    )
    assert (
        f"@{hosts.address['driver']}:7078" in executors
    )  # the driver's fixed port, from cluster-conf


def _probe(hosts: netns.Hosts, host: str, address: str, port: int) -> str:
    """From ``host``: "open" if ``address:port`` accepts a connection, else the error's name."""
    code = (
        f"import socket\ntry:\n socket.create_connection(({address!r}, {port}), "
        "timeout=5).close(); print('open')\nexcept OSError as e:\n print(type(e).__name__)"
    )
    done = subprocess.run(
        [*hosts.run(host), sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    return done.stdout.strip() or done.stderr[-500:]


def _check_web_uis_closed(hosts: netns.Hosts) -> None:
    """The master's UI (8080) and a worker's (8081) refuse another host, and answer on their
    own machine's loopback (where an SSH tunnel leads)."""
    assert _probe(hosts, "worker-b", hosts.address["driver"], 8080) == "ConnectionRefusedError"
    assert _probe(hosts, "driver", hosts.address["worker-a"], 8081) == "ConnectionRefusedError"
    assert _probe(hosts, "driver", "127.0.0.1", 8080) == "open"
    assert _probe(hosts, "worker-a", "127.0.0.1", 8081) == "open"
