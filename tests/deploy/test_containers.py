"""`docker compose up`, in containers: deploy/Dockerfile built as it is, the stack started
from docker-compose.yml (and deploy/kafka-secured.yml) with the stand-in images swapped in,
run and operated as a user runs it: the trainer trains from the producer's topic, Prometheus
scrapes both, the model server answers with the generated token, `stop` and `down`/`up`
keep the run exactly once and the secrets; the secured variant trains over SASL_SSL through
Spark's own Kafka source.

Slow (full tier): images are built on a new machine (minutes; kept for the next run), and
each stack starts Kafka, Spark and TensorFlow in containers. Skipped only where Podman
cannot start a container at all (no root, no Podman, a kernel that refuses)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.containers import PUBLISHED, Stack, build_images, cannot_run, http, port_taken

pytestmark = pytest.mark.slow
OVERRIDE = "deploy/standins/compose.yml"
#: What the runs here measured, for the closing lines of the test run.
MEASURED: dict[str, Any] = {}


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cannot = cannot_run()  # here, not at collection: the quick tier starts no container
    if cannot is not None:
        pytest.skip(cannot)
    started = time.monotonic()
    built = build_images(tmp_path_factory.mktemp("images") / "built.json")
    MEASURED["build_s"] = round(time.monotonic() - started)
    MEASURED["image_mb"] = round(built["localhost/streamtrain:local"]["bytes"] / 1e6)
    return built


def _up(stack: Stack) -> float:
    stack.down()  # a stack a killed run left behind
    taken = [f"{name} {port}" for name, port in PUBLISHED.items() if port_taken(port)]
    assert not taken, f"ports the compose file publishes are taken on this machine: {taken}"
    started = time.monotonic()
    stack.up()
    return started


def _rows(stack: Stack) -> list[dict[str, Any]]:
    rows = stack.volume("runs") / "mnist" / "batches.jsonl"
    if not rows.is_file():
        return []
    return [json.loads(line) for line in rows.read_text().splitlines() if line.strip()]


def _trained(stack: Stack) -> list[dict[str, Any]]:
    return [r for r in _rows(stack) if r.get("trained", 0) > 0]


def _token(stack: Stack) -> str:
    """The model server's token, read as the compose file's header says."""
    out = stack.compose(
        "run", "--rm", "--no-deps", "--entrypoint", "cat", "trainer", "/secrets/serve-token"
    )
    return out.strip().splitlines()[-1]


def _checkpoint(stack: Stack) -> Any:
    from pipeline.train import checkpoint

    return checkpoint.load(stack.volume("runs") / "mnist")


@pytest.fixture(scope="class")
def stack(images: dict[str, Any]) -> Iterator[Stack]:
    """The stack, up until its first trained micro-batch (TestStack's; down after it)."""
    stack = Stack("stct", ["docker-compose.yml", OVERRIDE])
    try:
        started = _up(stack)
        stack.wait(lambda: _trained(stack), 900, "the first trained micro-batch", "trainer")
        MEASURED["first_batch_s"] = round(time.monotonic() - started)
        yield stack
    finally:
        stack.down()


class TestStack:
    def test_up_trains_is_scraped_and_serves_with_its_token(self, stack: Stack) -> None:
        """Proves: from `up`, the trainer (as the image's user, Spark in local mode, workers
        over /dev/shm) trains the producer's MNIST replay; Prometheus, by the compose
        network's names, finds the trainer, its server and the producer up; the model server
        on the host's loopback answers a request with the token generated on first start and
        refuses one without it; the producer's and the trainer's healthchecks pass."""
        row = _trained(stack)[0]
        assert all(t["applied"] == t["steps"] for t in row["tasks"]), row
        assert {t["transport"] for t in row["tasks"]} == {"shared memory"}, row

        def targets_up() -> list[dict[str, Any]] | None:
            code, body = http(f"http://127.0.0.1:{PUBLISHED['prometheus']}/api/v1/targets")
            active = json.loads(body)["data"]["activeTargets"] if code == 200 else []
            up = active and all(t["health"] == "up" for t in active)
            return active if up else None

        for service in ("producer", "trainer"):  # the compose file's healthchecks pass
            stack.wait(lambda s=service: stack.healthy(s), 120, "a passing healthcheck", service)
        active = stack.wait(targets_up, 120, "every scrape target up", "prometheus")
        assert {t["labels"]["job"] for t in active} == {
            "streamtrain",
            "streamtrain-serve",
            "streamtrain-producer",
        }
        token = _token(stack)
        url = f"http://127.0.0.1:{PUBLISHED['trainer']}/v1/models/mnist:predict"
        body = json.dumps({"instances": [[0] * 784]}).encode()
        assert http(url, body)[0] == 401
        code, answer = stack.wait(
            lambda: (r := http(url, body, token))[0] == 200 and r, 120, "an answer", "trainer"
        )
        assert len(json.loads(answer)["predictions"][0]) == 10

    def test_stop_down_up_keep_the_run_exactly_once_and_the_secrets(self, stack: Stack) -> None:
        """Proves: `stop trainer` ends it within its grace with exit 0, its report and model
        in the runs volume; `down` then `up` keeps the volumes: the same token, the run
        resumed from the checkpoint, the ledger with no gap and no overlap across both."""
        from pipeline.train.ledger import check_ledger

        token = _token(stack)
        stack.compose("stop", "trainer", timeout=200)
        assert stack.state("trainer").get("ExitCode") == 0, stack.logs("trainer")
        out = stack.volume("runs") / "mnist"
        report = json.loads((out / "report.json").read_text())
        assert report["stopped_because"].startswith("SIGTERM"), report["stopped_because"]
        assert (out / "model.keras").is_file()
        stopped = _checkpoint(stack)
        assert stopped is not None and report["trained_records"] == stopped.extra["trained"]

        def beyond(before: Any) -> Any:
            now = _checkpoint(stack)
            return now if now is not None and now.last_batch_id > before.last_batch_id else None

        stack.down(keep_volumes=True)
        stack.up()
        again = stack.wait(lambda: beyond(stopped), 600, "a batch after down and up", "trainer")
        check_ledger(again.ledger)  # no gap, no overlap across stop, down and up
        assert again.extra["trained"] > stopped.extra["trained"]
        assert _token(stack) == token


class TestSecuredStack:
    def test_the_secured_variant_trains_over_sasl_ssl_through_sparks_own_source(
        self, images: dict[str, Any], tmp_path: Path
    ) -> None:
        """Proves: with deploy/kafka-secured.yml, the broker's TLS and SCRAM files are
        generated on first start, its user is made, and the producer and the trainer log in
        over SASL_SSL (the broker's only listener on the network): the trainer trains, here
        through Spark's own Kafka source baked into the image (STREAMTRAIN_SOURCE=jvm, as a
        user's override file sets it)."""
        jvm = tmp_path / "jvm-source.yml"
        jvm.write_text("services:\n  trainer:\n    environment:\n      STREAMTRAIN_SOURCE: jvm\n")
        files = ["docker-compose.yml", "deploy/kafka-secured.yml", OVERRIDE, str(jvm)]
        stack = Stack("stsec", files)
        try:
            started = _up(stack)
            stack.wait(lambda: _trained(stack), 900, "the first trained micro-batch", "trainer")
            MEASURED["secured_first_batch_s"] = round(time.monotonic() - started)
            record = json.loads((stack.volume("runs") / "mnist" / "run.json").read_text())
            assert record["settings"]["source"] == "jvm", record
        finally:
            stack.down()


@pytest.fixture(scope="module", autouse=True)
def _measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The build's and the stacks' times, in the test run's folder (containers.json)."""
    yield
    if MEASURED:
        out = tmp_path_factory.getbasetemp() / "containers.json"
        out.write_text(json.dumps(MEASURED, indent=2) + "\n")
