#!/usr/bin/env bash
# The README's test command: install test dependencies into .venv, then lint and test.
# Works on a fresh Debian/Ubuntu machine (as root it installs the Debian data packages too).
set -uo pipefail
cd "$(dirname "$0")/.."
# Each step's time, printed as it ends and again at the close, to keep the suite's cost in view.
step_started=$SECONDS
times=()
took() { times+=("$1 $((SECONDS - step_started)) s"); echo "time: $1 $((SECONDS - step_started)) s"; step_started=$SECONDS; }

# Real data and services the tests use; not installed where apt is not ours (the tests then say so).
need=()
dpkg -s dataset-fashion-mnist >/dev/null 2>&1 || need+=(dataset-fashion-mnist)
# A real Prometheus and promtool for the observability tests (they skip without it, except in CI).
command -v prometheus >/dev/null && command -v promtool >/dev/null || need+=(prometheus)
# kcat (librdkafka 2.0) for the broker/client compatibility tests.
command -v kcat >/dev/null || need+=(kcat)
# ip (iproute2) for the multi-host tests' network namespaces.
command -v ip >/dev/null || need+=(iproute2)
# Java runs Spark and Apache Kafka's broker, the tests' shared broker.
command -v java >/dev/null || need+=(openjdk-17-jre-headless)
# Podman (rootful, runc, netavark's name resolution) and debootstrap run the compose stack in
# containers, its images built without a registry (tests/deploy/test_containers.py). netavark
# sets up a bridge with iptables and fails without it ("netavark: No such file or directory").
for tool in podman runc debootstrap netavark aardvark-dns iptables; do
  command -v "$tool" >/dev/null || [ -x "/usr/lib/podman/$tool" ] || [ -x "/usr/sbin/$tool" ] \
    || need+=("$tool")
done
if [ ${#need[@]} -gt 0 ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "installing Debian packages: ${need[*]}"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}") >/dev/null \
    || echo "warning: could not install ${need[*]}"
fi

[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv || exit 1
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' || exit 1
took install
.venv/bin/ruff check pipeline producers tests bench || exit 1
# Every Python file the project owns (.gitignore's are left out, .venv with them); fix with `ruff format .`.
.venv/bin/ruff format --check . || exit 1
.venv/bin/mypy || exit 1
took lint
# Apache Kafka's jars, resolved once into the cache (by the Ivy pyspark ships, from Maven Central):
# the tests' shared broker is Kafka's own. One clear line and a stop when they cannot be had.
.venv/bin/python -m pipeline.ingest.kafka kafka || exit 1
took "kafka's jars"

# Two workers, each test file whole on one of them (its module fixtures started once), the
# longest files first (tests/conftest.py): many tests wait on brokers, JVMs and containers
# rather than compute, and two lanes fill those waits (README.md has the times).
# STREAMTRAIN_TEST_WORKERS=0 runs every test in this process, one after another (for --pdb).
.venv/bin/python -m pytest -n "${STREAMTRAIN_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
rc=$?
took pytest
echo "time: ${times[*]/%/;}" | sed 's/;$//'
# Exit 5 means pytest collected no test: report it, do not fail the run on it.
if [ "$rc" -eq 5 ]; then echo "pytest: no tests collected"; exit 0; fi
exit "$rc"
