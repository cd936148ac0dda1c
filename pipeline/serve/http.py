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
  read at once hold at most ``max_body_bytes * 4``: more wait for no one, they get a 503
  (the model's routes read it: :mod:`pipeline.serve.model_routes`).
* JSON nested deeper than the decoder allows, an integer of more than 40 digits, strings
  where numbers belong: a 400 that says so. Every answer is counted by status, every
  refusal by reason, those aiohttp's parser makes included.

Every prediction answers with its model's version, its data's freshness and its weights'
age (:mod:`pipeline.serve.model_routes`). With a token, the model routes want
``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import socket
import threading

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline.errors import ConfigError
from pipeline.observe.metrics import ServingMetrics, serving_metrics
from pipeline.observe.refusals import SERVE_REFUSALS
from pipeline.serve.connections import Gate
from pipeline.serve.instances import BadRequest
from pipeline.serve.model_routes import ModelRoutes, answer, error
from pipeline.serve.predictor import Predictor

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
        self.max_body_bytes, self.timeout_s = max_body_bytes, timeout_s
        self.max_connections, self.backlog = max_connections, backlog
        self.meters = meters or serving_metrics(name)
        self._prefix = f"/v1/models/{name}"
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
        self.routes = ModelRoutes(
            predictor,
            name=name,
            meters=self.meters,
            max_body_bytes=max_body_bytes,
            max_instances=max_instances,
            timeout_s=timeout_s,
        )
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
        self.routes.close()

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
        return answer(e.status, error(str(e)), headers)

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
            return answer(200, b'{"status": "ok"}')
        if path == "/metrics" and method == "GET":
            return answer(
                200, generate_latest(self.meters.registry), content_type=CONTENT_TYPE_LATEST
            )
        if not path.startswith(self._prefix):
            return answer(404, error(f"No such route: {path}. The model is at {self._prefix}."))
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
            return self.routes.status()
        if rest == "/metadata" and method == "GET":
            return self.routes.metadata()
        if rest == ":predict":
            if method != "POST":
                return answer(405, error("Expected POST for :predict."), {"Allow": "POST"})

            try:
                return await self.routes.predict(request)
            except BadRequest as e:
                return self._refuse(
                    e, {"Connection": "close"} if e.status in (408, 411, 413, 415, 503) else None
                )
        return answer(404, error(f"No such route: {path}. Try {self._prefix}:predict."))

    def _authorized(self, request: web.Request) -> bool:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        assert self.token is not None
        return scheme.lower() == "bearer" and hmac.compare_digest(
            value.strip().encode(), self.token.encode()
        )


def _host_name(host: str) -> str:
    """A ``Host`` header's name, its port left out.

    >>> _host_name("localhost:8501"), _host_name("[::1]:80"), _host_name("Example.COM")
    ('localhost', '[::1]', 'example.com')
    """
    host = host.lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0] if host.count(":") == 1 else host
