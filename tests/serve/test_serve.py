"""Serving the model a run trains: live HTTP predictions while it trains, the same scores
as the run's own held-out evaluation from its checkpoint, every kind of bad request
refused and counted, and the predict stream. Real run, real TensorFlow, real broker."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from producers import datasets

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # every test reads one full run served live
TOKEN = "test-token-not-secret"


def _request(
    port: int,
    method: str,
    path: str,
    body: Any = None,
    *,
    token: str | None = None,
    raw: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        sent = {"Content-Type": "application/json", **(headers or {})}
        if token:
            sent["Authorization"] = f"Bearer {token}"
        conn.request(method, path, body=data, headers=sent)
        resp = conn.getresponse()
        text = resp.read()
        return (
            resp.status,
            dict(resp.getheaders()),
            json.loads(text) if text[:1] in (b"{", b"[") else text,
        )
    finally:
        conn.close()


def _wait_for(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def mnist_test() -> Any:
    return datasets.get("mnist").load("test")


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory, mnist_test: Any) -> Iterator[dict[str, Any]]:
    """A real MNIST run with --serve-port 0, watched while it trains: what a client saw at
    each version, then the finished run's folder and report."""
    out = tmp_path_factory.mktemp("serve") / "run"
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "run",
        "--max-batches",
        "6",
        "--max-offsets-per-trigger",
        "3000",
        "--rate",
        "4000",
        "--eval-every",
        "1000",
        "--serve-port",
        "0",
        "--out",
        str(out),
    ]
    # stderr (Spark's and TensorFlow's chatter) to a file: a pipe nobody reads would fill and stall
    # the run.
    err_path = out.parent / "stderr.log"
    with open(err_path, "w") as err_file:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err_file, text=True)
    seen: dict[int, list[list[float]]] = {}
    lines: list[str] = []
    port = None
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "serving predictions at" in line:
                port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
                break
        assert port, "".join(lines)[-3000:] + err_path.read_text()[-3000:]
        x = mnist_test.x[:32].tolist()
        deadline, resets = time.monotonic() + 240, 0
        while proc.poll() is None and len(seen) < 3 and time.monotonic() < deadline:
            try:
                status, headers, body = _request(
                    port, "POST", "/v1/models/mnist:predict", {"instances": x}
                )
            except (ConnectionRefusedError, ConnectionResetError):
                # The run stops its model server when training ends, some seconds before the
                # process exits: a refusal or reset then is the end of the watch, not a fault
                # (the test below asserts enough versions were seen before it).
                resets += 1
                break
            if status == 200:
                seen.setdefault(int(headers["X-Model-Version"]), body["predictions"])
                # The bound (--serve-max-age 1) holds when the request starts; the header is
                # read after the prediction, some milliseconds later.
                assert float(headers["X-Weights-Age-Seconds"]) <= 1.5
            time.sleep(0.3)
        proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err_path.read_text()[-3000:]
    yield {
        "out": out,
        "seen": seen,
        "resets": resets,
        "report": json.loads((out / "report.json").read_text()),
    }


@pytest.fixture(scope="module")
def served(live_run: dict[str, Any]) -> Iterator[int]:
    """``streamtrain serve`` on the finished run's folder, with a token; yields its port."""
    env = {**os.environ, "STREAMTRAIN_SERVE_TOKEN": TOKEN}
    log = live_run["out"].parent / "serve-stderr.log"
    with open(log, "w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "serve", str(live_run["out"]), "--port", "0"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=err_file,
            env=env,
        )
    try:

        def ready() -> str | None:
            assert proc.poll() is None, log.read_text()[-3000:]
            return next(
                (line for line in log.read_text().splitlines() if "Ctrl-C stops it" in line), None
            )

        line = _wait_for(ready, 120, "the model server to listen")
        yield int(line.split("http://127.0.0.1:")[1].split("/")[0])
    finally:
        proc.terminate()
        proc.wait(30)


def test_live_predictions_change_as_the_clock_advances(live_run: dict[str, Any]) -> None:
    """Proves: `run --serve-port` answers from the weights being trained: a client saw
    several versions (the server's clock) and different predictions for the same images.

    Slow: mostly the set-up of the module's `live_run` fixture, which this test, the module's
    first, pays for: a whole `streamtrain run` of MNIST (its own Apache Kafka broker and replay,
    Spark, the parameter server, TensorFlow workers; six 3,000-record batches) served and
    watched live until it ends and writes its report."""
    seen = live_run["seen"]
    assert len(seen) >= 2, (
        f"saw only versions {sorted(seen)}; watch ended by a refused connection: "
        f"{live_run['resets']}"
    )
    versions = sorted(seen)
    first, last = np.array(seen[versions[0]]), np.array(seen[versions[-1]])
    assert first.shape == last.shape == (32, 10)
    assert np.abs(first - last).max() > 1e-3
    np.testing.assert_allclose(last.sum(axis=1), 1.0, atol=1e-3)  # softmax rows


def test_served_accuracy_matches_the_runs_held_out_score(
    served: int, live_run: dict[str, Any], mnist_test: Any
) -> None:
    """Proves: the checkpoint served over HTTP scores the MNIST test split as the run's own
    evaluation did at the same clock (within 0.01)."""
    status, _, body = _request(served, "GET", "/v1/models/mnist", token=TOKEN)
    assert status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"
    correct = 0
    n = len(mnist_test.y)
    for i in range(0, n, 1000):
        status, headers, body = _request(
            served,
            "POST",
            "/v1/models/mnist:predict",
            {"instances": mnist_test.x[i : i + 1000].tolist()},
            token=TOKEN,
        )
        assert status == 200, body
        correct += int((np.argmax(body["predictions"], axis=1) == mnist_test.y[i : i + 1000]).sum())
    final = live_run["report"]["final"]["accuracy"]
    assert correct / n == pytest.approx(final, abs=0.01)


BAD = [
    ("malformed JSON", b"{not json", 400, "Expected a JSON body"),
    ("a list, not an object", b"[1, 2]", 400, 'Expected a JSON object with "instances"'),
    ("wrong shape", json.dumps({"instances": [[1, 2, 3]]}).encode(), 400, "hold 784 numbers"),
    ("non-numeric", json.dumps({"instances": [["a"] * 784]}).encode(), 400, "only numbers"),
    (
        "out of range",
        json.dumps({"instances": [[300] * 784]}).encode(),
        400,
        "pixel values in [0, 255]",
    ),
    ("no instances", json.dumps({"instances": []}).encode(), 400, "at least one instance"),
    (
        "too many instances",
        json.dumps({"instances": [[0] * 784] * 1025}).encode(),
        413,
        "at most 1024 instances",
    ),
]


@pytest.mark.parametrize("what, raw, status, message", BAD, ids=[b[0] for b in BAD])
def test_bad_requests_get_a_4xx_that_says_what_was_expected(
    served: int, what: str, raw: bytes, status: int, message: str
) -> None:
    """Proves: each kind of bad body gets its 4xx and a message naming what was expected,
    and the server stays up for the next request."""
    got, _, body = _request(served, "POST", "/v1/models/mnist:predict", raw=raw, token=TOKEN)
    assert (got, message in body["error"]) == (status, True), body
    assert _request(served, "GET", "/healthz")[0] == 200


def test_oversized_bodies_and_missing_tokens_are_refused_and_counted(served: int) -> None:
    """Proves: a Content-Length over the limit is refused before the body is read, a
    request without the token gets a 401, and /metrics counts both by reason."""
    conn = http.client.HTTPConnection("127.0.0.1", served, timeout=30)
    conn.putrequest("POST", "/v1/models/mnist:predict")
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(64 << 20))
    conn.endheaders()  # the body never follows
    resp = conn.getresponse()
    assert resp.status == 413 and b"at most 16,777,216 bytes" in resp.read()
    conn.close()
    assert (
        _request(served, "POST", "/v1/models/mnist:predict", {"instances": [[0] * 784]})[0] == 401
    )
    assert (
        _request(
            served, "POST", "/v1/models/mnist:predict", {"instances": [[0] * 784]}, token="wrong"
        )[0]
        == 401
    )
    _, _, text = _request(served, "GET", "/metrics")
    metrics = text.decode()
    for reason in ("too_large", "unauthorized"):
        line = next(
            m
            for m in metrics.splitlines()
            if m.startswith("streamtrain_serve_bad_requests_total") and f'reason="{reason}"' in m
        )
        assert float(line.rsplit(" ", 1)[1]) >= 1, line
    assert 'streamtrain_serve_requests_total{code="401",model="mnist"}' in metrics


def test_concurrent_clients_all_get_answers(served: int, mnist_test: Any) -> None:
    """Proves: eight clients at once each get their own predictions (no torn weights, no
    mixed-up answers)."""
    results: dict[int, Any] = {}

    def client(i: int) -> None:
        results[i] = _request(
            served,
            "POST",
            "/v1/models/mnist:predict",
            {"instances": mnist_test.x[i : i + 1].tolist()},
            token=TOKEN,
        )

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    alone = [
        _request(
            served,
            "POST",
            "/v1/models/mnist:predict",
            {"instances": mnist_test.x[i : i + 1].tolist()},
            token=TOKEN,
        )[2]["predictions"]
        for i in range(8)
    ]
    assert [results[i][2]["predictions"] for i in range(8)] == alone


def test_predict_stream_writes_one_keyed_versioned_prediction_per_record(
    live_run, broker, topic, consume
) -> None:  # type: ignore[no-untyped-def]
    """Proves: `streamtrain predict` scores every input record once into the output topic,
    keyed like the input, with its partition, offset and the weights' version; run again
    on the same checkpoint it writes nothing more."""
    from pipeline.train import checkpoint
    from producers import Replay

    sent = Replay(
        datasets.get("mnist"),
        bootstrap=broker.bootstrap,
        topic=topic,
        partitions=2,
        limit=300,
        split="test",
    ).run()
    assert sent.records_sent == 300
    cmd = [
        sys.executable,
        "-m",
        "pipeline",
        "predict",
        "--run",
        str(live_run["out"]),
        "--topic",
        topic,
        "--bootstrap",
        broker.bootstrap,
        "--available-now",
    ]
    for _ in range(2):
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
    inputs = consume(topic, 300)
    # Asking for one more than expected proves there is no repeat: it waits its deadline out.
    outputs = consume(f"{topic}.predictions", 301, timeout_s=5)
    assert len(outputs) == 300, len(outputs)
    version = checkpoint.load(live_run["out"]).clock  # type: ignore[union-attr]
    by_origin = {
        (json.loads(o.value)["partition"], json.loads(o.value)["offset"]): o for o in outputs
    }
    assert len(by_origin) == 300
    for rec in inputs:
        out = by_origin[(rec.partition, rec.offset)]
        value = json.loads(out.value)
        assert out.key == rec.key and value["version"] == version and value["topic"] == topic
        assert len(value["probabilities"]) == 10 and value["class"] == int(
            np.argmax(value["probabilities"])
        )


def test_predict_stream_reads_json_instances_and_keeps_their_keys(
    live_run,
    broker,
    topic,
    consume,  # type: ignore[no-untyped-def]
    mnist_test,
) -> None:
    """Proves: with --input-format json, each JSON instance is scored with its own key kept
    (any bytes, not only record ids), and a value that is no instance is set aside to the
    output's dead-letter topic instead of being scored."""
    from kafka import KafkaProducer

    from pipeline.ingest.kafka import client

    client.ensure_topic(broker.bootstrap, topic, partitions=1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(20):
        value = json.dumps(
            mnist_test.x[i].tolist()
            if i % 2
            else {"instances": [mnist_test.x[i].reshape(28, 28).tolist()]}
        )
        producer.send(topic, key=f"user-{i}".encode(), value=value.encode())
    producer.send(topic, key=b"broken", value=b'{"instances": "nope"}')
    producer.flush()
    producer.close()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "predict",
            "--run",
            str(live_run["out"]),
            "--topic",
            topic,
            "--bootstrap",
            broker.bootstrap,
            "--available-now",
            "--input-format",
            "json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = consume(f"{topic}.predictions", 21, timeout_s=5)
    assert sorted(o.key for o in outputs) == sorted(f"user-{i}".encode() for i in range(20))
    labels = {f"user-{i}".encode(): int(mnist_test.y[i]) for i in range(20)}
    right = sum(json.loads(o.value)["class"] == labels[o.key] for o in outputs)
    assert right >= 14  # the short run's model: far above chance (2 of 20)
    [dead] = consume(f"{topic}.predictions.dlq", 1)
    assert dead.key == b"broken" and dict(dead.headers)["streamtrain.reason"] == b"not_an_instance"
