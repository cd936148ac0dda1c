"""The serving port's check (issue 29): it agrees with the server on which ports are free;
and a restarted run's model server, serving before the run's parameter server exists."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pipeline.cluster import scratch
from pipeline.errors import ConfigError
from pipeline.serve.process import check_serving


def _time_wait_port() -> int:
    """A port nothing listens on, whose last connection sits in TIME_WAIT (the server's side
    closed first, as a model server does after a stop)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = int(listener.getsockname()[1])
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server's side closes first: it keeps the port in TIME_WAIT
        client.recv(1)
        client.close()
    return port


def test_a_port_in_time_wait_after_a_stop_can_serve_again() -> None:
    """Proves: 15 s after a stop the port is refused no more ('Address already in use'): the
    check binds as the server does."""
    port = _time_wait_port()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # the TIME_WAIT is there: a bind without SO_REUSEADDR fails
    check_serving(port, 1.0, host="127.0.0.1")
    ThreadingHTTPServer(
        ("127.0.0.1", port), BaseHTTPRequestHandler
    ).server_close()  # as the model server binds


def test_a_port_someone_listens_on_is_refused_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with pytest.raises(ConfigError, match=f"Cannot serve predictions on 127.0.0.1:{port}"):
            check_serving(port, 1.0, host="127.0.0.1")


def _predict(url: str) -> tuple[int, float]:
    """The served weights' version and age, from one prediction's headers."""
    import json
    import urllib.request

    body = json.dumps({"instances": [[0.5] * 784]}).encode()
    request = urllib.request.Request(
        f"{url}:predict", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as r:
        return int(r.headers["X-Model-Version"]), float(r.headers["X-Weights-Age-Seconds"])


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_a_restarted_runs_server_answers_from_its_checkpoint_then_follows_the_live_center(
    tmp_path: Path,
) -> None:
    """Proves: a restarted run's model server answers before the run has a parameter server,
    from the checkpoint and the model the folder records, with their version and true age
    (a minute, past --serve-max-age: no newer weights exist while the run starts); handed the
    parameter server, it serves the live center (its clock, fresh)."""
    import keras

    from pipeline import codec
    from pipeline.jobs import run_record
    from pipeline.serve.process import ServingProcess
    from pipeline.train import checkpoint
    from pipeline.train.model import ModelSpec, get_flat
    from pipeline.train.ps import ParameterServer

    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10, activation="softmax")])
    spec = ModelSpec.from_model(model, optimizer="sgd", loss="sparse_categorical_crossentropy")
    run_record.describe_model(tmp_path, spec=spec, schema=codec.MNIST, name="m")
    saved = checkpoint.save(tmp_path, checkpoint.State(get_flat(model), clock=7, last_batch_id=3))
    a_minute_ago = time.time() - 60
    os.utime(saved, (a_minute_ago, a_minute_ago))
    with contextlib.ExitStack() as stack:
        stack.enter_context(scratch.scratch())  # the child's TensorFlow files, gone with it
        serving = ServingProcess.for_restart(
            run_dir=tmp_path,
            name="m",
            host="127.0.0.1",
            port=0,
            token=None,
            max_age_s=1.0,
            log_path=tmp_path / "serve.log",
        ).start()
        stack.callback(serving.stop)
        url = serving.wait(180)
        version, age = _predict(url)
        assert version == 7 and 60 <= age < 90, (version, age)
        with ParameterServer(get_flat(model), secret=b"restart-secret") as server:
            serving.follow(server, spec.size)
            deadline = time.monotonic() + 30
            while (answer := _predict(url)) != (0, pytest.approx(0.0, abs=1.0)):
                assert time.monotonic() < deadline, answer
                time.sleep(0.1)
