"""Build the stack's images where no registry serves them, with Podman: Debian 12 from
debootstrap, and on it stand-ins for the images docker-compose.yml pulls, then the project's
own image from deploy/Dockerfile as it is.

    python deploy/standins/build.py           # as root, with podman, debootstrap and Java
    export CONTAINERS_CONF=~/.cache/streamtrain/podman/containers.conf
    podman-compose -f docker-compose.yml -f deploy/standins/compose.yml up -d

(Podman 4's Docker API cannot take Compose v2's named volumes; podman-compose drives Podman
itself. docs/operating.md, "Containers", has the steps.)

Every layer comes from what a user trusts already: Debian's archive (the base, Python,
Java, Prometheus), PyPI (the project's dependencies) and Maven Central (Kafka's jars and
Spark's Kafka source). Grafana has no such source; compose.yml leaves it out. An image whose
inputs are unchanged is kept (a label holds their digest); Podman's layer cache keeps the
project's dependency layers across changes of its code.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PREFIX = "localhost/streamtrain-standin"
DEBIAN = f"{PREFIX}/debian:bookworm"
PYTHON = f"{PREFIX}/python:3.11-slim-bookworm"
KAFKA_VERSION = "4.4.0"  # the compose file's apache/kafka tag (a test keeps them equal)
KAFKA = f"{PREFIX}/kafka:{KAFKA_VERSION}"
PROMETHEUS = f"{PREFIX}/prometheus:debian-bookworm"
#: The project's image, the name docker-compose.yml gives it.
PROJECT = "localhost/streamtrain:local"
MIRROR = "http://deb.debian.org/debian"
LABEL = "streamtrain.standin.inputs"
#: Certificates this machine trusts beyond Debian's (a TLS-inspecting proxy's CA, say).
LOCAL_CA = "/usr/local/share/ca-certificates"


def say(line: str) -> None:
    print(f"standins: {line}", file=sys.stderr, flush=True)


def _under_hard_limit(which: int, cap: int) -> int:
    """``cap``, or this process's hard limit where lower (an unlimited one is -1)."""
    hard = resource.getrlimit(which)[1]
    return cap if hard == resource.RLIM_INFINITY else min(hard, cap)


def containers_conf() -> Path:
    """Podman's settings for these images: runc, and open-file and process limits that every
    container can be given. Podman's defaults (1,048,576 open files) exceed some machines' hard
    limits, and every container then fails ("error setting rlimit type 7"); so can a process
    limit under the hard one (seen: 65,536 under 96,365 failed, 32,768 ran). The limit on
    processes counts every thread of the container's user on the machine, so it stays high.
    CONTAINERS_CONF names the file."""
    from pipeline import config

    path = config.cache_dir() / "podman" / "containers.conf"
    nofile = _under_hard_limit(resource.RLIMIT_NOFILE, 65536)
    nproc = _under_hard_limit(resource.RLIMIT_NPROC, 32768)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
    )
    return path


def podman(*args: str, capture: bool = False) -> str:
    done = subprocess.run(
        ["podman", *args],
        check=False,
        text=True,
        stdout=subprocess.PIPE if capture else None,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"standins: error: `podman {' '.join(args[:3])} …` exited {done.returncode}"
        )
    return done.stdout or ""


def digest(*paths: Path, extra: str = "") -> str:
    """The inputs' digest: every file under ``paths``, by name and content."""
    h = hashlib.sha256(extra.encode())
    for base in paths:
        for f in sorted(p for p in ([base] if base.is_file() else base.rglob("*")) if p.is_file()):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def built_with(ref: str) -> str | None:
    """The inputs' digest ``ref`` was built from; None when there is no such image."""
    done = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{json .Labels}}", ref],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return None
    return (json.loads(done.stdout.strip() or "null") or {}).get(LABEL, "")


def debian() -> str:
    """Debian 12 (minbase) from debootstrap, imported as an image."""
    key = digest(extra=f"debootstrap --variant=minbase bookworm {MIRROR}")
    if built_with(DEBIAN) == key:
        return key
    say(f"debootstrap bookworm from {MIRROR} …")
    with tempfile.TemporaryDirectory(prefix="debian-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        subprocess.run(
            ["debootstrap", "--variant=minbase", "bookworm", str(rootfs), MIRROR],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        imported = subprocess.run(
            ["podman", "import", "--change", f"LABEL {LABEL}={key}", "--change", 'CMD ["bash"]']
            + ["-", DEBIAN],
            stdin=tar.stdout,
            check=False,
            stdout=subprocess.DEVNULL,
        )
        tar.stdout.close()  # a failed import must not leave tar blocked on the pipe
        if tar.wait() != 0 or imported.returncode != 0:
            # Never leave a partial root file system labelled as complete.
            subprocess.run(["podman", "rmi", "-f", DEBIAN], capture_output=True, check=False)
            raise SystemExit(
                f"standins: error: importing {rootfs} exited {tar.returncode} (tar) and "
                f"{imported.returncode} (podman import)"
            )
    return key


def build(ref: str, containerfile: Path, context: Path, key: str, **args: str) -> str:
    if built_with(ref) == key:
        return key
    say(f"building {ref} …")
    flags = [f"--build-arg={k}={v}" for k, v in args.items()]
    podman(
        "build",
        "--label",
        f"{LABEL}={key}",
        *flags,
        "-f",
        str(containerfile),
        "-t",
        ref,
        str(context),
    )
    return key


def python(base: str) -> str:
    """python:3.11-slim-bookworm's stand-in, trusting the machine's own certificates."""
    containerfile = HERE / "python.Containerfile"
    with tempfile.TemporaryDirectory(prefix="python-image-") as tmp:
        context = Path(tmp)
        (context / "local-ca").mkdir()
        for cert in sorted(Path(LOCAL_CA).glob("*.crt")):
            shutil.copy(cert, context / "local-ca" / cert.name)
        key = digest(containerfile, context / "local-ca", extra=base)
        return build(PYTHON, containerfile, context, key, DEBIAN_IMAGE=DEBIAN)


def kafka(base: str) -> str:
    """apache/kafka's stand-in: the release's jars (with kafka-tools, for its scripts)."""
    from pipeline.cluster import maven
    from pipeline.ingest.kafka import jvm_broker

    source = HERE / "kafka"
    key = digest(source, extra=base + KAFKA_VERSION)
    if built_with(KAFKA) == key:
        return key
    coordinates = [
        *jvm_broker.coordinates(KAFKA_VERSION),
        f"org.apache.kafka:kafka-tools:{KAFKA_VERSION}",
    ]
    jars = maven.resolve("kafka-image", coordinates, what="the Kafka stand-in image", quiet=False)
    with tempfile.TemporaryDirectory(prefix="kafka-image-") as tmp:
        context = Path(tmp) / "context"
        shutil.copytree(source, context)
        (context / "libs").mkdir()
        for jar in jars:
            shutil.copy(jar, context / "libs" / jar.name)
        return build(KAFKA, context / "Containerfile", context, key, PYTHON_IMAGE=PYTHON)


def project() -> str:
    """deploy/Dockerfile, on the Python stand-in; Podman's cache decides what is rebuilt."""
    say(f"building {PROJECT} from deploy/Dockerfile …")
    podman(
        "build",
        f"--build-arg=PYTHON_IMAGE={PYTHON}",
        "-f",
        str(ROOT / "deploy" / "Dockerfile"),
        "-t",
        PROJECT,
        str(ROOT),
    )
    return ""


def size(ref: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", ref, capture=True).strip())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write each image's size and build time here")
    opts = parser.parse_args(argv)
    # netavark runs iptables for every bridge it makes: without it each build step that
    # reaches the network fails with "netavark: No such file or directory".
    for tool in ("podman", "debootstrap", "iptables"):
        if shutil.which(tool) is None and shutil.which(tool, path="/usr/sbin:/sbin") is None:
            raise SystemExit(
                f"standins: error: Expected `{tool}` on PATH. Received: none. "
                "Install it (Debian: apt-get install podman runc debootstrap netavark "
                "aardvark-dns iptables)."
            )
    import os

    os.environ["CONTAINERS_CONF"] = str(containers_conf())
    report = {}

    def timed(ref: str, step: Callable[[], str]) -> str:
        started = time.monotonic()
        key = step()
        report[ref] = {"seconds": round(time.monotonic() - started, 1), "bytes": size(ref)}
        say(f"{ref}: {report[ref]['bytes'] / 1e6:,.0f} MB ({report[ref]['seconds']} s)")
        return key

    # Each image's key holds its base's, so a new base rebuilds what stands on it.
    base = timed(DEBIAN, debian)
    py = timed(PYTHON, lambda: python(base))
    timed(KAFKA, lambda: kafka(py))
    prom = HERE / "prometheus.Containerfile"
    timed(
        PROMETHEUS,
        lambda: build(PROMETHEUS, prom, HERE, digest(prom, extra=base), DEBIAN_IMAGE=DEBIAN),
    )
    timed(PROJECT, project)
    if opts.json:
        opts.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"export CONTAINERS_CONF={os.environ['CONTAINERS_CONF']}")


if __name__ == "__main__":
    main()
