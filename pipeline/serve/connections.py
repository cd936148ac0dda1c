"""The model server's connections: who gets one, for how long, and what a refused or
malformed one is told.

* The cap is enforced as each connection is accepted (a burst of 600 at once meets it,
  not the count of the connections already set up), and each client address has a share
  of it (a quarter), so one host cannot hold them all.
* At the cap, a newcomer evicts the oldest *idle* connection (one waiting for a request
  head: trickling one, or kept alive and silent) of its own address, else of any: a
  client that sends its request at once always gets in, however many slow ones wait;
  only when every connection is busy with a request is the newcomer refused (503).
* A connection's first head has ``timeout_s``, shortened as connections fill up (to a
  tenth of it at the cap): slow clients are let go sooner when others need the room.
  Evicted or late, a client is answered 408 and counted ``slow_head``.
* aiohttp's own answers to a malformed request are short JSON, never an echo of what
  the client sent.
"""

from __future__ import annotations

import asyncio
import collections
import json
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

if TYPE_CHECKING:
    from aiohttp.web_request import BaseRequest

    from pipeline.observe.metrics import ServingMetrics


def _raw(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, for a socket aiohttp is not parsing."""
    body = json.dumps({"error": message}).encode()
    return (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n"
        + ("Retry-After: 1\r\n" if status == 503 else "")
        + "\r\n"
    ).encode() + body


BUSY = _raw(503, "The server is at its connection limit; retry.")
SLOW_HEAD = _raw(
    408, "Expected a request head sooner; the connection was closed for others waiting."
)


class Gate:
    """Counts a server's connections, per client address, and decides who gets one."""

    def __init__(
        self,
        *,
        max_connections: int,
        timeout_s: float,
        meters: ServingMetrics,
        name: str,
        max_per_client: int | None = None,
    ) -> None:
        self.max_connections, self.timeout_s, self.meters, self.name = (
            max_connections,
            timeout_s,
            meters,
            name,
        )
        self.max_per_client = max_per_client or max(1, max_connections // 4)
        self.open: dict[Handler, None] = {}  # insertion order: oldest first
        self.per_client: collections.Counter[str] = collections.Counter()

    def count(self, status: int, reason: str) -> None:
        self.meters.requests.labels(self.name, str(status)).inc()
        self.meters.bad_requests.labels(self.name, reason).inc()

    def head_deadline(self) -> float:
        """Seconds a new connection has for its first head: ``timeout_s`` while under half the
        cap, down to a tenth of it at the cap."""
        load = len(self.open) / self.max_connections
        return self.timeout_s * max(0.1, min(1.0, 2.0 * (1.0 - load)))

    def make_room(self, peer: str | None = None) -> bool:
        """Evict the oldest idle connection (of ``peer``'s, else any; None: any); whether one
        was."""
        idle = [h for h in self.open if h.idle]
        victim = next((h for h in idle if h.peer == peer), None) if peer is not None else None
        if victim is None and (peer is None or self.per_client[peer] < self.max_per_client):
            victim = idle[0] if idle else None
        if victim is None:
            return False
        victim.evict()
        return True

    def accept(self, server: web.Server) -> asyncio.BaseProtocol:
        """The protocol for a connection just accepted: a handler, or :class:`Busy`."""
        if len(self.open) >= self.max_connections and not self.make_room():
            return Busy(self)
        handler = Handler(self, server, loop=server._loop, **server._kwargs)
        self.open[handler] = (
            None  # counted now: a burst's connections are all accepted before any is set up
        )
        return handler


class Busy(asyncio.Protocol):
    """A connection past the limit: a 503 and our end closed at once; what the client sends
    is discarded (closing with it unread would reset the connection, the 503 lost), for a
    second at most."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.gate.count(503, "busy")
        assert isinstance(transport, asyncio.Transport)
        transport.write(BUSY)
        transport.write_eof()
        asyncio.get_running_loop().call_later(1.0, transport.abort)

    def data_received(self, data: bytes) -> None:
        pass


class Handler(RequestHandler):
    """aiohttp's handler of one connection, counted by the :class:`Gate`, with a deadline for
    its first head and short JSON for aiohttp's own error answers."""

    __slots__ = ("gate", "peer", "_refused", "_head_timer")

    def __init__(self, gate: Gate, server: web.Server, **kwargs: Any) -> None:
        super().__init__(server, **kwargs)
        self.gate, self.peer, self._refused = gate, "", False
        self._head_timer: asyncio.TimerHandle | None = None

    @property
    def idle(self) -> bool:
        """Waiting for a request head (none yet, or kept alive after an answer)."""
        return (
            self.transport is not None
            and not self._request_in_progress
            and not self._messages
            and not self._force_close
            and not self._close
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        self.peer = str(peer[0]) if peer else ""
        gate = self.gate
        if gate.per_client[self.peer] >= gate.max_per_client and not gate.make_room(self.peer):
            # This address holds its share, all of it busy: refused, never handed to aiohttp.
            self._refused = True
            gate.open.pop(self, None)
            gate.count(503, "busy")
            assert isinstance(transport, asyncio.Transport)
            transport.write(BUSY)
            transport.close()
            return
        gate.per_client[self.peer] += 1
        super().connection_made(transport)
        # The first head's deadline is ours (it answers 408 and counts); aiohttp's keep-alive
        # timer would close the connection silently at the same moment. It takes over after
        # the first answer, for the idle time between requests.
        if self._keepalive_handle is not None:
            self._keepalive_handle.cancel()
            self._keepalive_handle = None
        self._head_timer = asyncio.get_running_loop().call_later(
            gate.head_deadline(), self._head_due
        )

    def _head_due(self) -> None:
        self._head_timer = None
        if self._request_count == 0 and self.idle:
            self.evict()

    def evict(self) -> None:
        """Close this idle connection with a 408, counted."""
        self.gate.open.pop(self, None)
        self.gate.count(408, "slow_head")
        transport = self.transport
        if transport is not None:
            transport.write(SLOW_HEAD)
        self.force_close()
        if transport is not None:
            transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._refused:
            return
        if self._head_timer is not None:
            self._head_timer.cancel()
        self.gate.open.pop(self, None)
        self.gate.per_client[self.peer] -= 1
        if self.gate.per_client[self.peer] <= 0:
            del self.gate.per_client[self.peer]
        super().connection_lost(exc)

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """aiohttp's answer to a request it could not parse or handle: the status and its
        phrase in JSON (its own page echoes part of the request)."""
        if request.writer.output_size > 0:
            raise ConnectionError(
                "Response is sent already, cannot send another response with the error message"
            )
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
        response = web.Response(
            status=status,
            body=json.dumps({"error": f"{status} {phrase}"}).encode(),
            content_type="application/json",
        )
        response.force_close()
        return response
