"""The model's routes: its status, its metadata and ``:predict``, answered from the predictor.

The server (:mod:`pipeline.serve.http`) decides who may ask; these answer what is asked.
A ``:predict`` body is read within its limits before it is parsed: over ``max_body_bytes``
it is refused (413) before it is read, and all bodies being read at once hold at most
``max_body_bytes * 4``: more wait for no one, they get a 503.

Every prediction answers with ``X-Model-Version``, ``X-Data-Freshness-Seconds`` where the run's
checkpoint says it (now minus the newest data the weights learned, the oldest partition's),
and ``X-Weights-Age-Seconds``, the age
when the answer leaves, never above ``max_age_s`` (over it: a 503) but for the checkpoint a
restarted run serves while it starts (no newer weights exist yet).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import json
import logging
import time
from typing import Any

import numpy as np
from aiohttp import web

from pipeline.observe.metrics import ServingMetrics
from pipeline.serve import instances
from pipeline.serve.instances import BadRequest, parse_request
from pipeline.serve.predictor import Predictor, Unavailable

log = logging.getLogger(__name__)


def error(message: str) -> bytes:
    """An error's JSON body.

    >>> error("No such route.")
    b'{"error": "No such route."}'
    """
    return json.dumps({"error": message}).encode()


def answer(
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


class ModelRoutes:
    """Answers the model's routes from ``predictor``, on the server's event loop.

    Args:
        predictor: the model and its weights.
        name: the model's name in the answers and the metrics' labels.
        meters: the server's metrics.
        max_body_bytes, max_instances: the largest request taken.
        timeout_s: seconds a client has to send a request's body, from its head.
    """

    def __init__(
        self,
        predictor: Predictor,
        *,
        name: str,
        meters: ServingMetrics,
        max_body_bytes: int,
        max_instances: int,
        timeout_s: float,
    ) -> None:
        self.predictor, self.name, self.meters = predictor, name, meters
        self.max_body_bytes, self.max_instances, self.timeout_s = (
            max_body_bytes,
            max_instances,
            timeout_s,
        )
        self._reading = 0  # body bytes being read now, at most 4 bodies' worth
        # Parsing and predicting leave the event loop: one thread per core is plenty (the
        # predictor calls the model one request at a time).
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="serve")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def status(self) -> web.Response:
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
        return answer(status, json.dumps({"model_version_status": [state]}).encode())

    def metadata(self) -> web.Response:
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
        return answer(200, json.dumps(body).encode())

    async def predict(self, request: web.Request) -> web.Response:
        """Answer a ``:predict``; a request refused for what it sent raises ``BadRequest``."""
        started = time.perf_counter()
        raw = await self._body(request)
        try:
            out, snap, parsed, n = await asyncio.get_running_loop().run_in_executor(
                self._pool, self._predict_sync, raw
            )
        except Unavailable as e:
            return answer(503, error(str(e)), {"Retry-After": "1"})
        except BadRequest:
            raise
        except (
            Exception
        ) as e:  # one line in the log, a 500 to the client, never a dropped connection
            log.error("a prediction failed: %s: %s", type(e).__name__, e)
            return answer(
                500, error(f"The prediction failed ({type(e).__name__}); see the server's log.")
            )
        # The age when the answer leaves, checked against the bound as it is reported.
        age, bound = snap.age_s(), self.predictor.max_age_s
        if bound is not None and snap.bounded and age > bound:
            return answer(
                503,
                error(f"The weights are {age:.3f} s old, over the bound of {bound:g} s."),
                {"Retry-After": "1"},
            )
        self.meters.instances.labels(self.name).observe(n)
        self.meters.model_version.labels(self.name).set(snap.version)
        unknown = self.predictor.take_unknown()
        if unknown:
            self.meters.unknown_ids.labels(self.name).inc(unknown)
        predicted: dict[str, Any] = {
            "outputs" if parsed.columnar else "predictions": np.round(
                out.astype(np.float64), 6
            ).tolist()
        }
        if parsed.filled is not None:  # what each instance lacked, and the schema's rule supplied
            predicted["filled"] = parsed.filled
        body = json.dumps(predicted)
        self.meters.latency.labels(self.name).observe(time.perf_counter() - started)
        headers = {"X-Model-Version": str(snap.version), "X-Weights-Age-Seconds": f"{age:.3f}"}
        freshness = snap.freshness_s()
        if freshness is not None:  # how old the newest data is that these weights learned
            headers["X-Data-Freshness-Seconds"] = f"{freshness:.3f}"
        return answer(200, body.encode(), headers)

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
