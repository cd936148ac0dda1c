"""Where a model server runs: in the foreground (``streamtrain serve RUN_DIR``), or in a
child of a training run (``streamtrain run --serve-port P``) that reads the live center.

The child is spawned, not forked (the driver holds Spark's JVM gateway and threads),
and gets the parameter server's address and secret through the spawn pipe, never in
its command line or environment.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from pipeline.cluster.security import LOOPBACK
from pipeline.errors import ConfigError, StreamtrainError

log = logging.getLogger(__name__)



def host_and_token() -> tuple[str, str | None]:
    """Where model servers listen and the token they ask for (``STREAMTRAIN_SERVE_HOST``,
    ``STREAMTRAIN_SERVE_TOKEN``); off loopback a token is required."""
    from pipeline import config

    settings = config.settings()
    token = settings.serve_token.get_secret_value() if settings.serve_token else None
    if settings.serve_host not in LOOPBACK and not token:
        raise ConfigError(f"STREAMTRAIN_SERVE_HOST={settings.serve_host} exposes the model beyond this machine: "
                          "set STREAMTRAIN_SERVE_TOKEN too, or serve on 127.0.0.1.")
    return settings.serve_host, token


def check_serving(port: int, max_age_s: float | None) -> None:
    """Refuse a serving port or bound that cannot work, before anything starts."""
    import socket

    if not 0 <= port <= 65535:
        raise ConfigError(f"Expected --serve-port in [0, 65535] (0: a free port). Received: {port}")
    if max_age_s is not None and max_age_s <= 0:
        raise ConfigError(f"Expected --serve-max-age > 0 seconds. Received: {max_age_s}")
    host, _ = host_and_token()
    if port:
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError as e:
                raise ConfigError(f"Cannot serve predictions on {host}:{port} ({e.strerror}). "
                                  "Pass another --serve-port, or 0 for a free one.") from None


def _stop_on_signals() -> threading.Event:
    """An event that SIGINT or SIGTERM sets (the main thread waits on it in short steps, so
    that the handler runs promptly)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _wait(stop: threading.Event) -> None:
    while not stop.wait(0.5):
        pass


def serve_folder(run_dir: Path, *, host: str, port: int, name: str | None, token: str | None,
                 max_age_s: float | None) -> None:
    """Serve the model of the run in ``run_dir`` from its checkpoint (reloaded whenever the
    run writes one) until SIGINT or SIGTERM."""
    from pipeline.serve.http import ModelServer
    from pipeline.serve.predictor import Predictor, read_description
    from pipeline.serve.weights import CheckpointWeights

    recorded, spec, schema = read_description(run_dir)
    source = CheckpointWeights(run_dir)
    source.start()
    try:
        predictor = Predictor(spec, schema, source, max_age_s=max_age_s)
        server = ModelServer(predictor, name=name or recorded, host=host, port=port, token=token).start()
        print(f"serving {name or recorded} from {run_dir} at {server.url}:predict; Ctrl-C stops it",
              file=sys.stderr, flush=True)
        _wait(_stop_on_signals())
        server.stop()
    finally:
        source.close()


def serve_live(job: dict[str, Any], report: Any, log_path: str) -> None:
    """The child's entry point: serve the live center of a run's parameter server.

    Args:
        job: ``spec`` (JSON), ``schema`` and ``name`` (see :func:`predictor.write_description`),
            ``address``, ``secret``, ``size``, ``host``, ``port``, ``token``, ``max_age_s``,
            ``refresh_s``, and ``parent`` (the driver's pid).
        report: a connection the bound port (or ``{"error": ...}``) is sent through.
        log_path: where the child's output goes.
    """
    from pipeline.ingest.kafka.broker import die_with_parent

    with open(log_path, "a") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname).1s %(name)s: %(message)s", datefmt="%H:%M:%S")
    stop = _stop_on_signals()
    die_with_parent(job["parent"])  # a driver killed outright leaves no server behind
    from pipeline.serve.http import ModelServer
    from pipeline.serve.predictor import Predictor, schema_from_dict
    from pipeline.serve.weights import LiveWeights
    from pipeline.train.model import ModelSpec

    source = LiveWeights(job["address"], secret=job["secret"], size=job["size"], interval_s=job["refresh_s"])
    try:
        schema = schema_from_dict(job["schema"])
        source.start()
        # One TensorFlow thread: the cores belong to the training it runs beside.
        predictor = Predictor(ModelSpec.from_json(job["spec"]), schema, source, max_age_s=job["max_age_s"],
                              threads=1)
        server = ModelServer(predictor, name=job["name"], host=job["host"], port=job["port"],
                             token=job["token"]).start()
    except Exception as e:  # the parent turns it into one line
        log.exception("the model server could not start")
        report.send({"error": f"{type(e).__name__}: {e}"})
        source.close()
        return
    log.info("serving %s at %s:predict", job["name"], server.url)
    report.send({"port": server.port, "url": server.url})
    try:
        _wait(stop)
    finally:
        server.stop()
        source.close()


class ServingProcess:
    """A model server for a training run, in a spawned child that reads the live center.

    Args:
        job: what :func:`serve_live` takes.
        log_path: the child's output.
    """

    @classmethod
    def for_run(cls, *, name: str, spec: Any, schema: Any, server: Any, port: int, max_age_s: float,
                log_path: Path) -> ServingProcess:
        """The server for a run's parameter ``server`` (its address and secret) and model."""
        from pipeline.serve.predictor import schema_dict

        host, token = host_and_token()
        return cls({"name": name, "spec": spec.to_json(), "schema": schema_dict(schema),
                    "address": f"{server.host}:{server.port}", "secret": server.secret, "size": spec.size,
                    "host": host, "port": port, "token": token, "max_age_s": max_age_s,
                    "refresh_s": min(0.2, max_age_s / 4), "parent": os.getpid()}, log_path)

    def __init__(self, job: dict[str, Any], log_path: Path) -> None:
        self.job, self.log_path = job, log_path
        self.url: str | None = None
        self._process: Any = None
        self._report: Any = None

    def start(self) -> ServingProcess:
        """Start the child; it imports TensorFlow and builds the model while the caller goes
        on (see :meth:`wait`)."""
        ctx = multiprocessing.get_context("spawn")
        self._report, child_end = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=serve_live, args=(self.job, child_end, str(self.log_path)),
                                    name="streamtrain-serve", daemon=True)
        self._process.start()
        child_end.close()
        return self

    def wait(self, timeout_s: float = 180.0) -> str:
        """Block until the child listens; return its URL. Raises if it failed."""
        if self.url is not None:
            return self.url
        if not self._report.poll(timeout_s):
            raise StreamtrainError(f"The model server did not start within {timeout_s:.0f} s; see {self.log_path}.")
        try:
            answer = self._report.recv()
        except EOFError:
            raise StreamtrainError(f"The model server died while starting; see {self.log_path}.") from None
        if "error" in answer:
            raise StreamtrainError(f"The model server failed to start: {answer['error']}")
        self.url = str(answer["url"])
        return self.url

    def stop(self) -> None:
        proc = self._process
        if proc is not None and proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
