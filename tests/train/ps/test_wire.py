"""Narrowed payloads on the socket (--wire-dtype): half the bytes each way, the server's
center kept in float32, and frames that misdeclare their type refused. Real server, real
sockets on loopback."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.train.ps import Client, ParameterServer, wire
from pipeline.train.ps import protocol as p
from tests.train.ps.test_encryption import _Tap
from tests.train.ps.test_server import _raw_session, _reply_status

SECRET = b"per-run-secret"
N = 1000


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with ParameterServer(np.zeros(N, np.float32), secret=SECRET, shared_memory=False) as s:
        yield s


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_narrowed_pushes_add_up_in_a_float32_center(server: ParameterServer, dtype: str) -> None:
    """Proves: many small narrowed deltas accumulate in the float32 center (a narrow center
    would stop moving: 1 + 1e-3 is 1 in bfloat16), and each pull comes back rounded once."""
    delta = np.full(N, 1e-3, np.float32)
    with Client(server.address, secret=SECRET, worker=0, size=N, wire_dtype=dtype) as c:
        assert c.pull().shape == (N,)
        for _ in range(1000):
            c.push(delta)
        center = c.pull()
    narrow = (
        delta[:1]
        .astype(np.float16 if dtype == "float16" else ml_dtypes.bfloat16)
        .astype(np.float32)[0]
    )
    assert narrow != np.float32(1e-3)  # rounded on the way
    np.testing.assert_allclose(
        server.weights(), 1000 * narrow, rtol=1e-5
    )  # exact sums of the narrowed deltas
    np.testing.assert_allclose(center, server.weights(), rtol=2**-8)  # one rounding on the way back
    assert server.stats()["refused"] == {}


def test_half_the_bytes_cross_the_socket(server: ParameterServer) -> None:
    def bytes_each_way(dtype: str) -> tuple[int, int]:
        tap = _Tap(server.address)
        try:
            with Client(
                tap.address, secret=SECRET, worker=0, size=N, shared_memory=False, wire_dtype=dtype
            ) as c:
                c.pull()
                for _ in range(10):
                    c.push_pull(np.ones(N, np.float32))
        finally:
            tap.close()
        return sum(map(len, tap.sent)), sum(map(len, tap.received))

    wide, narrow = bytes_each_way("float32"), bytes_each_way("bfloat16")
    for w, n in zip(wide, narrow, strict=True):
        assert 0.45 < n / w < 0.55, (wide, narrow)


@pytest.mark.parametrize(
    "flags, length, reason",
    [
        (wire.MASK, 0, "frame"),  # no such type
        (wire.FLAGS["bfloat16"], N * 4, "size"),  # a float32 push's length under a bfloat16 flag
        (p.SHARED | wire.FLAGS["bfloat16"], 0, "frame"),  # shared memory carries float32 only
    ],
)
def test_a_frame_that_misdeclares_its_type_is_refused(
    server: ParameterServer, flags: int, length: int, reason: str
) -> None:
    sock, session = _raw_session(server)
    header, _ = session.seal(p.Header(p.PUSH if length else p.PULL, 0, 1, 0, length, flags=flags))
    sock.sendall(header)
    assert p.STATUS[_reply_status(sock)] == reason
    sock.close()
    assert server.stats()["refused"] == {reason: 1} and server.clock == 0


def test_an_unknown_wire_dtype_is_one_line() -> None:
    with pytest.raises(
        ConfigError, match="Expected a wire dtype in float32, bfloat16, float16. Received: 'int8'"
    ):
        Client(("127.0.0.1", 1), secret=SECRET, worker=0, size=N, wire_dtype="int8")


def test_float16_past_its_range_is_one_line_naming_bfloat16(server: ParameterServer) -> None:
    """Proves: a delta past float16's +-65504 is not sent (it would arrive as an Inf and
    read as a diverged model), and a center past it is not trained from; both say to use
    bfloat16, and nothing is applied."""
    with Client(server.address, secret=SECRET, worker=0, size=N, wire_dtype="float16") as c:
        c.pull()
        with pytest.raises(p.ProtocolError, match="float16's range.*bfloat16") as refused:
            c.push(np.full(N, 1e5, np.float32))
        assert refused.value.reason == "range"
    assert server.clock == 0
    server.restore(np.full(N, 7e4, np.float32), 0)
    with (
        Client(server.address, secret=SECRET, worker=0, size=N, wire_dtype="float16") as c,
        pytest.raises(p.ProtocolError, match="center has weights past float16's range"),
    ):
        c.pull()
