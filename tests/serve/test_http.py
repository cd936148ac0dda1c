"""The model server against hostile clients: slow heads and bodies, connection floods,
request smuggling, bodies that cost more than their size, JSON that breaks decoders, and
the max-age promise. A real model (Keras, TensorFlow) serving a real parameter server's
live center over real sockets; no full run needed."""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import generate_latest

from pipeline import codec
from pipeline.observe import refusals
from pipeline.serve.http import ModelServer
from pipeline.serve.predictor import Predictor
from pipeline.serve.weights import LiveWeights
from pipeline.train.ps import ParameterServer

SECRET = b"serve-test-secret"
PATH = "/v1/models/m:predict"


@pytest.fixture(scope="module")
def live() -> Iterator[tuple[ParameterServer, Any]]:
    """A parameter server holding a small MNIST classifier's weights, and its spec."""
    import keras

    from pipeline.train.model import ModelSpec, get_flat

    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10, activation="softmax")])
    spec = ModelSpec.from_model(model, optimizer="sgd", loss="sparse_categorical_crossentropy")
    with ParameterServer(get_flat(model), secret=SECRET) as server:
        yield server, spec


@contextlib.contextmanager
def serving(live: tuple[ParameterServer, Any], **options: Any) -> Iterator[ModelServer]:
    server, spec = live
    source = LiveWeights(
        f"{server.host}:{server.port}", secret=SECRET, size=server.size, interval_s=0.05
    )
    source.start()
    try:
        predictor = Predictor(
            spec, codec.MNIST, source, max_age_s=options.pop("max_age_s", 5.0), threads=1
        )
        deadline = time.monotonic() + 30
        while source.latest() is None:
            assert time.monotonic() < deadline, "no weights read"
            time.sleep(0.02)
        app = ModelServer(predictor, name="m", **options).start()
        try:
            yield app
        finally:
            app.stop()
    finally:
        source.close()


def _post(
    port: int, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(
            "POST", PATH, body=body, headers={"Content-Type": "application/json", **(headers or {})}
        )
        resp = conn.getresponse()
        text = resp.read()
        return resp.status, dict(resp.getheaders()), json.loads(text) if text[:1] == b"{" else text
    finally:
        conn.close()


def _raw(port: int, data: bytes, timeout_s: float = 5) -> bytes:
    """Send ``data`` on a fresh connection; everything the server sends until it closes
    (or ``timeout_s`` of silence)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        got = b""
        with contextlib.suppress(TimeoutError):
            while chunk := sock.recv(65536):
                got += chunk
        return got


def _metric(app: ModelServer, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted({"model": "m", **labels}.items()))
    for metric in app.meters.registry.collect():
        for s in metric.samples:
            if (
                s.name == name
                and ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items())) == want
            ):
                return float(s.value)
    return 0.0


ONE = json.dumps({"instances": [[0] * 784]}).encode()
BAD = [
    ("deep JSON", b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "too_deep"),
    ("a 310-digit integer", b'{"instances": [[' + b"9" * 310 + b"]]}", 400, "number_too_large"),
    ("numbers as strings", json.dumps({"instances": [["1"] * 784]}).encode(), 400, "not_numeric"),
    (
        "a cheap body of 8M values",
        b'{"instances": [[' + b"0," * (4 << 20) + b"0]]}",
        413,
        "too_many_values",
    ),
]


def test_every_refusal_reason_is_a_series_from_the_start(live) -> None:  # type: ignore[no-untyped-def]
    """Proves: each refusal reason is at 0 before the first refusal, so rate() sees the first
    one (a series that first appears at 1 stayed at 0 on the dashboard)."""
    with serving(live) as app:
        text = generate_latest(app.meters.registry).decode()
    for reason in refusals.SERVE_REFUSALS:
        assert f'streamtrain_serve_bad_requests_total{{model="m",reason="{reason}"}} 0.0' in text, (
            reason
        )


@pytest.mark.parametrize("what, body, status, reason", BAD, ids=[b[0] for b in BAD])
def test_bodies_that_break_decoders_get_a_status_and_a_count(
    live,
    what: str,
    body: bytes,
    status: int,  # type: ignore[no-untyped-def]
    reason: str,
) -> None:
    """Proves: JSON deeper than the decoder goes (RecursionError), an integer a float cannot
    hold (OverflowError), numeric strings as pixels and a body of millions of values (~30
    bytes of Python objects each) each get their status and are counted by reason; the
    server answers the next request."""
    with serving(live) as app:
        got, _, answer = _post(app.port, body)
        assert got == status, answer
        assert _metric(app, "streamtrain_serve_bad_requests_total", reason=reason) == 1
        assert _post(app.port, ONE)[0] == 200


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_malformed_heads_and_smuggled_requests_get_one_answer_each(live) -> None:  # type: ignore[no-untyped-def]
    """Proves: a non-numeric Content-Length gets a 400 (counted "malformed"), not a dropped
    connection; a chunked body that carries a second request inside is the body, never a
    request of its own (one answer); a request with no length gets a 411."""
    with serving(live) as app:
        answer = _raw(
            app.port,
            b"POST "
            + PATH.encode()
            + b" HTTP/1.1\r\nHost: localhost\r\nContent-Length: abc\r\n\r\n{}",
        )
        assert answer.split(b" ")[1] == b"400", answer[:200]
        assert _metric(app, "streamtrain_serve_bad_requests_total", reason="malformed") == 1
        smuggled = b"GET /v1/models/m HTTP/1.1\r\nHost: localhost\r\n\r\n"
        chunk = b'{"x": "' + smuggled + b'"}'
        answer = _raw(
            app.port,
            b"POST "
            + PATH.encode()
            + b" HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n"
            b"Connection: close\r\n\r\n"
            + f"{len(chunk):x}\r\n".encode()
            + chunk
            + b"\r\n0\r\n\r\n",
        )
        assert answer.count(b"HTTP/1.1 ") == 1 and answer.startswith(b"HTTP/1.1 400"), answer[:300]
        answer = _raw(app.port, b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 411"), answer[:200]
        assert _metric(app, "streamtrain_serve_requests_total", code="411") == 1


def test_slow_clients_meet_deadlines_and_a_flood_meets_the_connection_limit(live) -> None:  # type: ignore[no-untyped-def]
    """Proves: at the connection limit, a client that sends its request at once evicts the
    oldest idle connection (answered 408, counted "slow_head") and is served; clients
    sending a head one byte every 0.2 s are closed when the head's deadline (1 s, less as
    connections fill up) passes, not kept alive by each byte; only when every connection is
    busy with a request does a newcomer get a 503 (counted "busy"); a body that trickles
    gets a 408; afterwards a client is served."""
    with serving(live, timeout_s=1.0, max_connections=4) as app:
        idle = [socket.create_connection(("127.0.0.1", app.port), timeout=5) for _ in range(4)]
        time.sleep(0.05)  # accepted
        got = _raw(
            app.port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        assert got.startswith(b"HTTP/1.1 200"), got[
            :100
        ]  # an idle one made room (or its deadline had)
        for sock in idle:  # each one closed with a 408 at its deadline, or as it made room
            assert sock.recv(4096).startswith(b"HTTP/1.1 408")
            sock.close()
        assert _metric(app, "streamtrain_serve_bad_requests_total", reason="slow_head") == 4
        head = (
            b"POST "
            + PATH.encode()
            + b" HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10\r\n"
        )
        slow = [socket.create_connection(("127.0.0.1", app.port), timeout=5) for _ in range(4)]
        started, closed = time.monotonic(), set()
        for i in range(30):  # bounded: 6 s of trickle at most
            for k, sock in enumerate(slow):
                if k not in closed:
                    try:
                        sock.send(head[i : i + 1])
                        if not sock.recv(4096, socket.MSG_DONTWAIT):
                            closed.add(k)
                    except BlockingIOError:
                        pass  # nothing from the server yet
                    except OSError:
                        closed.add(k)
            if len(closed) == len(slow):
                break
            time.sleep(0.2)
        assert len(closed) == len(slow), "a trickling head outlived its deadline"
        assert time.monotonic() - started < 3.0
        for sock in slow:
            sock.close()
        # Every connection busy with a request (its body on the way): a newcomer is refused.
        busy = [socket.create_connection(("127.0.0.1", app.port), timeout=10) for _ in range(4)]
        for sock in busy:
            sock.sendall(head + b"\r\n{")  # 1 of 10 body bytes
        time.sleep(0.2)  # their heads are read
        assert _raw(app.port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").startswith(
            b"HTTP/1.1 503"
        )
        assert _metric(app, "streamtrain_serve_bad_requests_total", reason="busy") == 1
        for sock in busy:
            assert sock.recv(65536).startswith(b"HTTP/1.1 408")  # the body's deadline
            sock.close()
        assert _post(app.port, ONE)[0] == 200


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_no_answer_is_older_than_the_max_age(live) -> None:  # type: ignore[no-untyped-def]
    """Proves: with --serve-max-age 0.5, while the weights stop refreshing and age past the
    bound (three times), every 200 says an age within the bound and the rest are 503s. Each
    round waits for a first fresh answer (a loaded machine may take seconds), then ages."""
    server, spec = live
    ages: list[float] = []
    statuses: list[int] = []
    body = json.dumps({"instances": [[0] * 784] * 4}).encode()
    with serving(live, max_age_s=0.5) as app:
        predictor = app.predictor
        for _ in range(3):
            source = LiveWeights(
                f"{server.host}:{server.port}", secret=SECRET, size=server.size, interval_s=0.05
            )
            source.start()
            old, predictor.source = predictor.source, source
            old.close()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # fresh weights are in: the server answers
                status, headers, _ = _post(app.port, body)
                if status == 200:
                    ages.append(float(headers["X-Weights-Age-Seconds"]))
                    break
            source.close()  # from now on the weights age
            stop = time.monotonic() + 1.5

            def client(stop: float = stop) -> None:
                while time.monotonic() < stop:
                    status, headers, _ = _post(app.port, body)
                    statuses.append(status)
                    if status == 200:
                        ages.append(float(headers["X-Weights-Age-Seconds"]))

            threads = [threading.Thread(target=client) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
    assert len(ages) >= 3 and 503 in statuses, statuses
    assert max(ages) <= 0.5, sorted(ages)[-5:]
    assert set(statuses) <= {200, 503}


def test_a_burst_meets_the_cap_as_connections_are_accepted(live) -> None:  # type: ignore[no-untyped-def]
    """Proves: 300 connections opened at once against a cap of 64 leave at most 64 open on
    the server (the cap is counted as each is accepted, not once aiohttp set it up), and a
    normal request afterwards is served."""
    with serving(live, max_connections=64, timeout_s=5.0) as app:
        burst = []
        try:
            for _ in range(300):  # bounded: a fixed burst
                with contextlib.suppress(OSError):
                    burst.append(socket.create_connection(("127.0.0.1", app.port), timeout=5))
            time.sleep(0.3)  # every one accepted and answered or held
            assert len(app.gate.open) <= 64
            refused = _metric(app, "streamtrain_serve_bad_requests_total", reason="busy")
            evicted = _metric(app, "streamtrain_serve_bad_requests_total", reason="slow_head")
            assert refused + evicted >= 300 - 64, (refused, evicted)
        finally:
            for sock in burst:
                sock.close()
        assert _post(app.port, ONE)[0] == 200


def test_browsers_cannot_reach_the_loopback_server(live) -> None:  # type: ignore[no-untyped-def]
    """Proves: a request naming another host (DNS rebinding: the attacker's name resolving
    to 127.0.0.1) gets a 421; a cross-site form's text/plain POST gets a 415; both counted;
    aiohttp's own 400 for a malformed head is short JSON, with nothing of the request in it."""
    with serving(live) as app:
        rebound = _raw(
            app.port,
            b"GET /v1/models/m HTTP/1.1\r\nHost: attacker.example:8501\r\nConnection: "
            b"close\r\n\r\n",
        )
        assert rebound.startswith(b"HTTP/1.1 421"), rebound[:200]
        status, _, answer = _post(app.port, ONE, {"Content-Type": "text/plain"})
        assert status == 415 and "application/json" in answer["error"], answer
        assert _metric(app, "streamtrain_serve_bad_requests_total", reason="wrong_host") == 1
        assert _metric(app, "streamtrain_serve_bad_requests_total", reason="content_type") == 1
        marker = b"SECRET-LOOKING-PAYLOAD"
        answer_bytes = _raw(
            app.port,
            b"POST "
            + PATH.encode()
            + b" HTTP/1.1\r\nHost: localhost\r\nContent-Length: x"
            + marker
            + b"\r\n\r\n",
        )
        head, _, body = answer_bytes.partition(b"\r\n\r\n")
        assert (
            head.split(b" ")[1] == b"400"
            and marker not in body
            and json.loads(body) == {"error": "400 Bad Request"}
        )
        assert _post(app.port, ONE)[0] == 200
    with serving(live, allowed_hosts=("proxy.internal",)) as app:  # STREAMTRAIN_SERVE_ALLOWED_HOSTS
        named = _raw(
            app.port,
            b"GET /healthz HTTP/1.1\r\nHost: proxy.internal:80\r\nConnection: close\r\n\r\n",
        )
        assert named.startswith(b"HTTP/1.1 200"), named[:200]


def test_long_strings_are_refused_before_they_are_built_and_memory_is_given_back(live) -> None:  # type: ignore[no-untyped-def]
    """Proves: eight 15 MB bodies of one string each, at once, are refused (413,
    "string_too_long") before the decoder builds a Python or numpy string of them, and
    the process's resident memory returns within 60 MB of where it started."""
    body = b'{"instances": [["' + b"a" * (15 << 20) + b'"]]}'

    def rss_mb() -> float:
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    with serving(live, max_body_bytes=16 << 20) as app:
        assert _post(app.port, ONE)[0] == 200  # warmed up: the model and the pools exist
        before = rss_mb()
        results: list[int] = []
        threads = [
            threading.Thread(target=lambda: results.append(_post(app.port, body)[0]))
            for _ in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results and all(r in (413, 503) for r in results) and 413 in results, results
        assert _metric(app, "streamtrain_serve_bad_requests_total", reason="string_too_long") >= 1
        # glibc keeps freed memory in each request thread's arena: hand it back before
        # measuring, so that what is measured is only what is still held (a retained body is
        # 15 MB, a numpy string built of it four times that).
        trim = ctypes.CDLL("libc.so.6").malloc_trim
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            trim(0)
            if rss_mb() - before <= 60:
                break
            time.sleep(0.2)  # the bodies' buffers are freed as their requests end
        assert rss_mb() - before <= 60, (before, rss_mb())


def test_a_tables_instances_are_checked_by_name_and_their_gaps_named(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Proves (issue 41, item 3): an empty instance, a misspelt field and a category given as
    a number, true or NaN are 400s naming the field (every expected field listed); a gap the
    schema fills is named in "filled"; the metadata names the fields, kinds and classes."""
    import keras

    from pipeline.table import TableSchema
    from pipeline.train.model import ModelSpec, get_flat

    names = [f"x{i}" for i in range(9)]
    table = TableSchema.from_dict(
        {
            "features": [{"name": n} for n in names]
            + [{"name": "color", "kind": "categorical", "vocabulary": ["red", "blue"]}],
            "label": {"name": "kind", "classes": ["a", "b", "c"]},
        }
    )
    model = keras.Sequential(
        [keras.Input((table.width,)), keras.layers.Dense(3, activation="softmax")]
    )
    spec = ModelSpec.from_model(model, optimizer="sgd", loss="sparse_categorical_crossentropy")
    with ParameterServer(get_flat(model), secret=SECRET) as server:
        source = LiveWeights(
            f"{server.host}:{server.port}", secret=SECRET, size=server.size, interval_s=0.05
        )
        source.start()
        try:
            predictor = Predictor(spec, codec.table("t", table), source, max_age_s=5.0, threads=1)
            deadline = time.monotonic() + 30
            while source.latest() is None:
                assert time.monotonic() < deadline, "no weights read"
                time.sleep(0.02)
            app = ModelServer(predictor, name="m").start()
            try:
                full = {**{n: 1.0 for n in names}, "color": "red"}
                status, _, answer = _post(
                    app.port, json.dumps({"instances": [full, {"x0": 2, "color": None}]}).encode()
                )
                assert status == 200 and len(answer["predictions"]) == 2, answer
                assert answer["filled"] == [[], [*names[1:], "color"]]
                for instance, reason, words in [
                    ({}, "no_features", "at least one of the schema's fields"),
                    (
                        {"x0": 1, "colour": "red"},
                        "unknown_field",
                        "unknown ones in instance 0: ['colour']",
                    ),
                    ({"color": 5}, "bad_field", "Received: 5."),
                    ({"color": True}, "bad_field", "Received: true."),
                ]:
                    status, _, answer = _post(
                        app.port, json.dumps({"instances": [instance]}).encode()
                    )
                    assert status == 400 and words in answer["error"], answer
                    assert _metric(app, "streamtrain_serve_bad_requests_total", reason=reason) >= 1
                    if reason == "unknown_field":
                        assert str(names + ["color"]) in answer["error"]  # all ten, not eight
                status, _, answer = _post(app.port, b'{"instances": [{"color": NaN}]}')
                assert status == 400 and "Received: NaN." in answer["error"], answer
                conn = http.client.HTTPConnection("127.0.0.1", app.port, timeout=30)
                conn.request("GET", "/v1/models/m/metadata")
                meta = json.loads(conn.getresponse().read())["metadata"]
                conn.close()
                assert [f["name"] for f in meta["inputs"]["fields"]] == [*names, "color"]
                assert meta["inputs"]["fields"][-1] == {
                    "name": "color",
                    "kind": "categorical",
                    "missing": "fill",
                    "values": ["red", "blue"],
                }
                assert meta["outputs"] == {
                    "shape": [-1, 3],
                    "meaning": "class probabilities",
                    "classes": ["a", "b", "c"],
                    "label": "kind",
                }
            finally:
                app.stop()
        finally:
            source.close()
