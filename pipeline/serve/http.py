"""The prediction server: TensorFlow Serving's REST API over the live (or saved) model.

    GET  /v1/models/<name>            version (the parameter server's clock) and status
    GET  /v1/models/<name>/metadata   the input shape and classes
    POST /v1/models/<name>:predict    {"instances": [...]} or {"inputs": [...]}
    GET  /metrics                     Prometheus
    GET  /healthz                     200 while the process runs

Every prediction answers with ``X-Model-Version`` and ``X-Weights-Age-Seconds``. A body
over ``max_body_bytes`` is refused before it is read; a client gets ``timeout_s`` per
request and at most ``max_connections`` are served at once (the rest get a 503 at
once), so a slow or greedy peer holds neither memory nor threads. With a token, the
model routes want ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline.errors import ConfigError
from pipeline.observe.metrics import ServingMetrics, serving_metrics
from pipeline.serve.instances import BadRequest, parse
from pipeline.serve.predictor import Predictor, Unavailable

log = logging.getLogger(__name__)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    app: ModelServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "streamtrain-serve"
    # Buffered: the headers and the body leave in one write when the request is done. Two
    # small writes would wait out the client's delayed ACK (40 ms a request, measured).
    wbufsize = 1 << 16

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.app.timeout_s)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.client_address[0], *args)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.server.app.handle(self, "GET")

    def do_POST(self) -> None:  # noqa: N802
        self.server.app.handle(self, "POST")

    def reply(self, status: int, body: bytes, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class ModelServer:
    """Serves ``predictor`` over HTTP from daemon threads.

    Args:
        predictor: the model and its weights.
        name: the model's name in the URLs.
        host, port: where to listen (loopback unless deployed; port 0 picks one).
        token: a bearer token the model routes require (None: none).
        max_body_bytes, max_instances: the largest request taken.
        max_connections: requests served at once; more get a 503.
        timeout_s: seconds a client has to send its request.
    """

    def __init__(self, predictor: Predictor, *, name: str, host: str = "127.0.0.1", port: int = 0,
                 token: str | None = None, max_body_bytes: int = 16 << 20, max_instances: int = 1024,
                 max_connections: int = 64, timeout_s: float = 10.0, meters: ServingMetrics | None = None) -> None:
        self.predictor, self.name, self.token = predictor, name, token
        self.max_body_bytes, self.max_instances, self.timeout_s = max_body_bytes, max_instances, timeout_s
        self.meters = meters or serving_metrics(name)
        self._slots = threading.BoundedSemaphore(max_connections)
        self._prefix = f"/v1/models/{name}"
        for code in ("200", "400", "401", "404", "405", "411", "413", "503"):
            self.meters.requests.labels(name, code)
        self.meters.weights_age.labels(name).set_function(self._age)
        try:
            self._httpd = _Server((host, port), _Handler)
        except OSError as e:
            raise ConfigError(f"Cannot serve predictions on {host}:{port} ({e.strerror}). "
                              "Pass another --serve-port, or 0 for a free one.") from None
        self._httpd.app = self
        self.host, self.port = host, int(self._httpd.server_address[1])
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="serve-http", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self._prefix}"

    def start(self) -> ModelServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _age(self) -> float:
        snap = self.predictor.source.latest()
        return snap.age_s() if snap is not None else float("nan")

    # --- one request ---

    def handle(self, req: _Handler, method: str) -> None:
        if not self._slots.acquire(blocking=False):
            req.close_connection = True
            return self._answer(req, 503, _error("The server is at its connection limit; retry shortly."))
        try:
            self._route(req, method)
        finally:
            self._slots.release()

    def _answer(self, req: _Handler, status: int, body: bytes, headers: dict[str, str] | None = None,
                content_type: str = "application/json") -> None:
        if req.path.startswith(self._prefix):
            self.meters.requests.labels(self.name, str(status)).inc()
        req.reply(status, body, content_type, headers)

    def _refuse(self, req: _Handler, e: BadRequest) -> None:
        self.meters.bad_requests.labels(self.name, e.reason).inc()
        if e.status == 413:
            req.close_connection = True  # the body was left unread
        self._answer(req, e.status, _error(str(e)))

    def _route(self, req: _Handler, method: str) -> None:
        path = req.path.split("?", 1)[0]
        if path == "/healthz" and method == "GET":
            return req.reply(200, b'{"status": "ok"}')
        if path == "/metrics" and method == "GET":
            return req.reply(200, generate_latest(self.meters.registry), CONTENT_TYPE_LATEST)
        if not path.startswith(self._prefix):
            return req.reply(404, _error(f"No such route: {path}. The model is at {self._prefix}."))
        if self.token is not None and not self._authorized(req):
            self.meters.bad_requests.labels(self.name, "unauthorized").inc()
            return self._answer(req, 401, _error("Expected an Authorization: Bearer <token> header with the "
                                                 "server's token."), {"WWW-Authenticate": "Bearer"})
        rest = path[len(self._prefix):]
        if rest in ("", "/") and method == "GET":
            return self._status(req)
        if rest == "/metadata" and method == "GET":
            return self._metadata(req)
        if rest == ":predict":
            if method != "POST":
                return self._answer(req, 405, _error("Expected POST for :predict."), {"Allow": "POST"})
            return self._predict(req)
        return self._answer(req, 404, _error(f"No such route: {path}. Try {self._prefix}:predict."))

    def _authorized(self, req: _Handler) -> bool:
        given = req.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        assert self.token is not None
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), self.token.encode())

    def _status(self, req: _Handler) -> None:
        try:
            snap = self.predictor.snapshot()
            state = {"version": str(snap.version), "state": "AVAILABLE", "status": {"error_code": "OK",
                                                                                     "error_message": ""}}
            status = 200
        except Unavailable as e:
            latest = self.predictor.source.latest()
            state = {"version": str(latest.version) if latest else "0", "state": "UNAVAILABLE",
                     "status": {"error_code": "UNAVAILABLE", "error_message": str(e)}}
            status = 503
        self._answer(req, status, json.dumps({"model_version_status": [state]}).encode())

    def _metadata(self, req: _Handler) -> None:
        schema = self.predictor.schema
        body = {"model_spec": {"name": self.name},
                "metadata": {"inputs": {"shape": [-1, *self.predictor.input_shape], "features": schema.n_features,
                                        "units": "pixel values 0-255" if schema.dtype == "uint8" else "numbers"},
                             "outputs": {"shape": [-1, schema.num_classes], "meaning": "class probabilities"}}}
        self._answer(req, 200, json.dumps(body).encode())

    def _predict(self, req: _Handler) -> None:
        started = time.perf_counter()
        try:
            raw = self._body(req)
            x, columnar = parse(raw, self.predictor.schema, max_instances=self.max_instances)
        except BadRequest as e:
            return self._refuse(req, e)
        try:
            out, snap = self.predictor.predict(x)
        except Unavailable as e:
            return self._answer(req, 503, _error(str(e)), {"Retry-After": "1"})
        self.meters.instances.labels(self.name).observe(len(x))
        self.meters.model_version.labels(self.name).set(snap.version)
        body = json.dumps({"outputs" if columnar else "predictions": np.round(out.astype(np.float64), 6).tolist()}).encode()
        self._answer(req, 200, body, {"X-Model-Version": str(snap.version),
                                      "X-Weights-Age-Seconds": f"{snap.age_s():.3f}"})
        self.meters.latency.labels(self.name).observe(time.perf_counter() - started)

    def _body(self, req: _Handler) -> bytes:
        length = req.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            raise BadRequest("Expected a Content-Length header with the body's size in bytes.", status=411,
                             reason="no_length")
        n = int(length)
        if n > self.max_body_bytes:
            raise BadRequest(f"Expected a body of at most {self.max_body_bytes:,} bytes. Received a Content-Length "
                             f"of {n:,}; split the request.", status=413, reason="too_large")
        return req.rfile.read(n)
