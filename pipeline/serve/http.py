"""The prediction server: TensorFlow Serving's REST API over the live (or saved) model.

    GET  /v1/models/<name>            version (the parameter server's clock) and status
    GET  /v1/models/<name>/metadata   the input shape and classes
    POST /v1/models/<name>:predict    {"instances": [...]} or {"inputs": [...]}
    GET  /metrics                     Prometheus
    GET  /healthz                     200 while the process runs

It runs on aiohttp (its HTTP parser frames every request itself: no body is ever read as
the next request, and a malformed head is a 400), on one event loop in a thread, so a slow
client holds a socket, never a thread. The limits:

* ``max_connections`` open connections, a quarter of them per client address, counted as
  each is accepted: a newcomer past them evicts the oldest idle connection (408), or is
  answered 503 when none is idle (:mod:`pipeline.serve.connections`); the listening
  backlog is ``backlog``.
* ``timeout_s`` for a request's head, counted from the connection's start or the last
  answer (however the bytes trickle in; the first head's shrinks as connections fill
  up), and again for its body, from the head's arrival; a late one gets a 408.
* Bound to loopback, only requests for a loopback host name are answered (421 otherwise:
  a web page's DNS rebinding), plus ``allowed_hosts``; a POST body must be
  ``application/json`` (415: a cross-site form cannot send one without asking first).
* A body over ``max_body_bytes`` is refused (413) before it is read, and all bodies being
  read at once hold at most ``max_body_bytes * 4``: more wait for no one, they get a 503.
* JSON nested deeper than the decoder allows, an integer of more than 40 digits, strings
  where numbers belong: a 400 that says so. Every answer is counted by status, every
  refusal by reason, those aiohttp's parser makes included.

Every prediction answers with ``X-Model-Version``, ``X-Data-Freshness-Seconds`` where the run's
checkpoint says it (now minus the newest data the weights learned, the oldest partition's),
and ``X-Weights-Age-Seconds``, the age
when the answer leaves, never above ``max_age_s`` (over it: a 503) but for the checkpoint a
restarted run serves while it starts (no newer weights exist yet). With a token, the
model routes want ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import hmac
import json
import logging
import socket
import threading
import time
from typing import Any

import numpy as np
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline.errors import ConfigError
from pipeline.observe.metrics import ServingMetrics, serving_metrics
from pipeline.observe.refusals import SERVE_REFUSALS
from pipeline.serve import instances
from pipeline.serve.connections import Gate
from pipeline.serve.instances import BadRequest, parse_request
from pipeline.serve.predictor import Predictor, Unavailable

log = logging.getLogger(__name__)

#: Statuses counted from the start (a first refusal is a change, not a new series).
STATUSES = ("200", "400", "401", "404", "405", "408", "411", "413", "415", "421", "500", "503")
#: Host names a loopback server answers to: a web page's request to another name (DNS
#: rebinding: a name of the attacker's that now resolves to 127.0.0.1) is refused.
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
_ROUTED = web.RequestKey("routed", bool)


class _OneLine(logging.Filter):
    """aiohttp logs a malformed request with a traceback at ERROR; it is the client's fault,
    counted already: one debug line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            record.msg = f"{record.getMessage()}: {str(record.exc_info[1]).splitlines()[0]}"
            record.args, record.exc_info, record.exc_text = (), None, None
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return log.isEnabledFor(logging.DEBUG)


_quiet = log.getChild("aiohttp")
_quiet.addFilter(_OneLine())


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


class _Counted(AbstractAccessLogger):
    """Counts every answer, those aiohttp gives itself (a malformed request head) included."""

    app: ModelServer

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        self.app.counted(request, response.status)

    @property
    def enabled(self) -> bool:
        return True


class ModelServer:
    """Serves ``predictor`` over HTTP from an event loop in a daemon thread.

    Args:
        predictor: the model and its weights.
        name: the model's name in the URLs.
        host, port: where to listen (loopback unless deployed; port 0 picks one).
        token: a bearer token the model routes require (None: none).
        max_body_bytes, max_instances: the largest request taken.
        max_connections: connections open at once; one more gets a 503 and is closed.
        timeout_s: seconds a client has to send a request's head, and then its body.
        backlog: connections the kernel queues before they are accepted.
        allowed_hosts: more ``Host`` names a loopback server answers to (a proxy's).
    """

    def __init__(
        self,
        predictor: Predictor,
        *,
        name: str,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        max_body_bytes: int = 16 << 20,
        max_instances: int = 1024,
        max_connections: int = 256,
        timeout_s: float = 10.0,
        backlog: int = 1024,
        meters: ServingMetrics | None = None,
        allowed_hosts: tuple[str, ...] = (),
    ) -> None:
        self.predictor, self.name, self.token = predictor, name, token
        self.max_body_bytes, self.max_instances, self.timeout_s = (
            max_body_bytes,
            max_instances,
            timeout_s,
        )
        self.max_connections, self.backlog = max_connections, backlog
        self.meters = meters or serving_metrics(name)
        self._prefix = f"/v1/models/{name}"
        self._reading = 0  # body bytes being read now, at most 4 bodies' worth
        for code in STATUSES:
            self.meters.requests.labels(name, code)
        for reason in SERVE_REFUSALS:
            self.meters.bad_requests.labels(name, reason)
        self.meters.weights_age.labels(name).set_function(self._age)
        try:
            self._sock = socket.create_server((host, port), backlog=backlog)
        except OSError as e:
            raise ConfigError(
                f"Cannot serve predictions on {host}:{port} ({e.strerror}). "
                "Pass another --serve-port, or 0 for a free one."
            ) from None
        self.host, self.port = host, int(self._sock.getsockname()[1])
        loopback = host in ("127.0.0.1", "localhost", "::1")
        # Beyond loopback each client address has a quarter of the connections; on it, every
        # client is this machine's.
        self.gate = Gate(
            max_connections=max_connections,
            timeout_s=timeout_s,
            meters=self.meters,
            name=name,
            max_per_client=max_connections if loopback else None,
        )
        # Any host name may reach a server bound beyond loopback (it asks for a token instead).
        self._hosts = {h.lower() for h in (*LOOPBACK_HOSTS, *allowed_hosts)} if loopback else None
        # Parsing and predicting leave the event loop: one thread per core is plenty (the
        # predictor calls the model one request at a time).
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="serve")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="serve-http", daemon=True
        )
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}{self._prefix}"

    def start(self) -> ModelServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(60)
        return self

    async def _start(self) -> None:
        app = web.Application(client_max_size=self.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        counted = type("Counted", (_Counted,), {"app": self})  # aiohttp makes the logger itself
        # keepalive_timeout closes a connection whose next request head has not arrived
        # within it, from its start or the last answer: the head's deadline.
        self._runner = web.AppRunner(
            app,
            access_log_class=counted,
            access_log=log,
            handle_signals=False,
            keepalive_timeout=self.timeout_s,
            max_line_size=8190,
            max_field_size=8190,
            max_headers=64,
            logger=_quiet,
        )
        await self._runner.setup()
        self._server = await self._loop.create_server(
            self._connection, sock=self._sock, backlog=self.backlog
        )

    def _connection(self) -> asyncio.BaseProtocol:
        assert self._runner is not None and self._runner.server is not None
        return self.gate.accept(self._runner.server)

    def stop(self) -> None:
        async def _stop() -> None:
            if self._server is not None:
                self._server.close()
            if self._runner is not None:
                await self._runner.cleanup()

        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(_stop(), self._loop).result(30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._sock.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _age(self) -> float:
        snap = self.predictor.source.latest()
        return snap.age_s() if snap is not None else float("nan")

    # --- counting ---

    def counted(self, request: web.BaseRequest, status: int) -> None:
        """Count an answer: on the model's routes, and any malformed request aiohttp refused
        before a route saw it."""
        ours = request.get(_ROUTED, False)
        if not ours and status >= 400:
            self.meters.bad_requests.labels(self.name, "malformed").inc()
        if not ours or request.path.startswith(self._prefix):
            self.meters.requests.labels(self.name, str(status)).inc()

    def _refuse(self, e: BadRequest, headers: dict[str, str] | None = None) -> web.Response:
        self.meters.bad_requests.labels(self.name, e.reason).inc()
        return _answer(e.status, _error(str(e)), headers)

    # --- one request ---

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        request[_ROUTED] = True
        path, method = request.path, request.method
        if self._hosts is not None and _host_name(request.host) not in self._hosts:
            return self._refuse(
                BadRequest(
                    "Expected a request for this machine's loopback name "
                    f"({', '.join(sorted(self._hosts))}). "
                    "Received another Host: a web page's DNS rebinding is refused.",
                    status=421,
                    reason="wrong_host",
                )
            )
        if path == "/healthz" and method == "GET":
            return _answer(200, b'{"status": "ok"}')
        if path == "/metrics" and method == "GET":
            return _answer(
                200, generate_latest(self.meters.registry), content_type=CONTENT_TYPE_LATEST
            )
        if not path.startswith(self._prefix):
            return _answer(404, _error(f"No such route: {path}. The model is at {self._prefix}."))
        if self.token is not None and not self._authorized(request):
            return self._refuse(
                BadRequest(
                    "Expected an Authorization: Bearer <token> header with the server's token.",
                    status=401,
                    reason="unauthorized",
                ),
                {"WWW-Authenticate": "Bearer"},
            )
        rest = path[len(self._prefix) :]
        if rest in ("", "/") and method == "GET":
            return self._status()
        if rest == "/metadata" and method == "GET":
            return self._metadata()
        if rest == ":predict":
            if method != "POST":
                return _answer(405, _error("Expected POST for :predict."), {"Allow": "POST"})

            try:
                return await self._predict(request)
            except BadRequest as e:
                return self._refuse(
                    e, {"Connection": "close"} if e.status in (408, 411, 413, 415, 503) else None
                )
        return _answer(404, _error(f"No such route: {path}. Try {self._prefix}:predict."))

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        assert self.token is not None
        return scheme.lower() == "bearer" and hmac.compare_digest(
            value.strip().encode(), self.token.encode()
        )

    def _status(self) -> web.Response:
        try:
            snap = self.predictor.snapshot()
            state = {
                "version": str(snap.version),
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
            status = 200
        except Unavailable as e:
            latest = self.predictor.source.latest()
            state = {
                "version": str(latest.version) if latest else "0",
                "state": "UNAVAILABLE",
                "status": {"error_code": "UNAVAILABLE", "error_message": str(e)},
            }
            status = 503
        return _answer(status, json.dumps({"model_version_status": [state]}).encode())

    def _metadata(self) -> web.Response:
        schema = self.predictor.schema
        inputs = {
            "shape": [-1, *self.predictor.input_shape],
            "features": schema.n_features,
            "units": "pixel values 0-255" if schema.dtype == "uint8" else "numbers",
        }
        outputs: dict[str, Any] = {
            "shape": [-1, schema.num_classes],
            "meaning": "class probabilities",
        }
        if (
            schema.table is not None
        ):  # a table's fields by name and kind, its classes or its numeric target
            from pipeline.serve import table_instances

            described = table_instances.metadata(schema.table)
            inputs.update(described["inputs"], units="raw fields, transformed by the run's schema")
            outputs = described["outputs"]
        body = {
            "model_spec": {"name": self.name},
            "metadata": {"inputs": inputs, "outputs": outputs},
        }
        return _answer(200, json.dumps(body).encode())

    async def _predict(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        raw = await self._body(request)
        try:
            out, snap, parsed, n = await self._loop.run_in_executor(
                self._pool, self._predict_sync, raw
            )
        except Unavailable as e:
            return _answer(503, _error(str(e)), {"Retry-After": "1"})
        except BadRequest:
            raise
        except (
            Exception
        ) as e:  # one line in the log, a 500 to the client, never a dropped connection
            log.error("a prediction failed: %s: %s", type(e).__name__, e)
            return _answer(
                500, _error(f"The prediction failed ({type(e).__name__}); see the server's log.")
            )
        # The age when the answer leaves, checked against the bound as it is reported.
        age, bound = snap.age_s(), self.predictor.max_age_s
        if bound is not None and snap.bounded and age > bound:
            return _answer(
                503,
                _error(f"The weights are {age:.3f} s old, over the bound of {bound:g} s."),
                {"Retry-After": "1"},
            )
        self.meters.instances.labels(self.name).observe(n)
        self.meters.model_version.labels(self.name).set(snap.version)
        answer: dict[str, Any] = {
            "outputs" if parsed.columnar else "predictions": np.round(
                out.astype(np.float64), 6
            ).tolist()
        }
        if parsed.filled is not None:  # what each instance lacked, and the schema's rule supplied
            answer["filled"] = parsed.filled
        body = json.dumps(answer)
        self.meters.latency.labels(self.name).observe(time.perf_counter() - started)
        headers = {"X-Model-Version": str(snap.version), "X-Weights-Age-Seconds": f"{age:.3f}"}
        freshness = snap.freshness_s()
        if freshness is not None:  # how old the newest data is that these weights learned
            headers["X-Data-Freshness-Seconds"] = f"{freshness:.3f}"
        return _answer(200, body.encode(), headers)

    def _predict_sync(self, raw: bytes) -> tuple[np.ndarray, Any, instances.Request, int]:
        try:
            request = parse_request(raw, self.predictor.schema, max_instances=self.max_instances)
            out, snap = self.predictor.predict(request.x)
            return out, snap, request, len(request.x)
        finally:
            if len(raw) > _TRIM_AFTER:
                _trim()

    async def _body(self, request: web.Request) -> bytes:
        """The body, read before the deadline and within the budget of bodies in flight."""
        n = request.content_length
        if n is None and not request.body_exists:
            raise BadRequest(
                "Expected a Content-Length header with the body's size in bytes.",
                status=411,
                reason="no_length",
            )
        if n is None:  # chunked: read up to the limit (aiohttp answers 413 past it)
            n = self.max_body_bytes
        if n > self.max_body_bytes:
            raise BadRequest(
                f"Expected a body of at most {self.max_body_bytes:,} bytes. "
                f"Received a Content-Length of {n:,}; split the request.",
                status=413,
                reason="too_large",
            )
        if request.content_type != "application/json":
            # A cross-site form or fetch without a preflight can only send text/plain and forms.
            raise BadRequest(
                "Expected Content-Type: application/json. "
                f"Received: {request.content_type or 'none'}.",
                status=415,
                reason="content_type",
            )
        if self._reading + n > 4 * self.max_body_bytes:
            raise BadRequest(
                "The server is reading as many bodies as it holds at once; retry shortly.",
                status=503,
                reason="busy",
            )
        self._reading += n  # the event loop's thread alone counts
        try:
            async with asyncio.timeout(self.timeout_s):
                return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BadRequest(
                f"Expected a body of at most {self.max_body_bytes:,} bytes. "
                "Received more; split the request.",
                status=413,
                reason="too_large",
            ) from None
        except TimeoutError:
            raise BadRequest(
                f"Expected the body within {self.timeout_s:g} s of the request's head. "
                "Received part of it; send it at once.",
                status=408,
                reason="slow_body",
            ) from None
        finally:
            self._reading -= n


#: A body this large leaves freed memory in the allocator's arenas: hand it back to the system.
_TRIM_AFTER = 1 << 20


def _trim() -> None:
    """glibc keeps what a large request freed for reuse (hundreds of MB after a few bodies
    of strings); ``malloc_trim`` returns it. Elsewhere a no-op."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _host_name(host: str) -> str:
    """A ``Host`` header's name, its port left out.

    >>> _host_name("localhost:8501"), _host_name("[::1]:80"), _host_name("Example.COM")
    ('localhost', '[::1]', 'example.com')
    """
    host = host.lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _answer(
    status: int,
    body: bytes,
    headers: dict[str, str] | None = None,
    content_type: str = "application/json",
) -> web.Response:
    response = web.Response(status=status, body=body, headers=headers)
    response.content_type = content_type.split(";")[0]
    if ";" in content_type:
        response.headers["Content-Type"] = content_type
    return response
