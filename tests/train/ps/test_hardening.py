"""The parameter server against hostile or broken peers: refusals on /metrics, poison
updates, slow handshakes, and memory an authenticated client can claim."""

from __future__ import annotations

import time
import urllib.request

import numpy as np
import pytest

from pipeline.jobs.run_metrics import RunMetrics
from pipeline.observe import metrics
from pipeline.train.ps import Client, ParameterServer, ProtocolError

SECRET = b"per-run-secret"
N = 1000


def _wait(condition, timeout_s: float = 10.0, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(0.02)


def test_refusals_reach_prometheus(caplog: pytest.LogCaptureFixture) -> None:
    """Proves: a peer with the wrong secret is refused and the refusal is on the run's
    /metrics (streamtrain_ps_refusals_total{reason="auth"}), every reason a series from 0."""
    run = RunMetrics(dataset="mnist", algorithm="sync", topic="t", workers=1)
    served = metrics.serve(run.meters.registry)
    try:
        def scrape() -> str:
            with urllib.request.urlopen(served.url, timeout=5) as r:  # noqa: S310 (loopback)
                return str(r.read().decode())

        assert 'streamtrain_ps_refusals_total{reason="auth"} 0.0' in scrape()
        assert 'streamtrain_ps_refusals_total{reason="busy"} 0.0' in scrape()
        with ParameterServer(np.zeros(N, np.float32), secret=SECRET, on_refusal=run.on_ps_refusal) as server:
            with pytest.raises((ProtocolError, ConnectionError)), \
                    Client(server.address, secret=b"guess", worker=0, size=N) as c:
                c.pull()
            _wait(lambda: 'streamtrain_ps_refusals_total{reason="auth"} 1.0' in scrape(), what="the refusal on /metrics")
    finally:
        served.stop()


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "tcp"])
@pytest.mark.parametrize("poison", [np.nan, np.inf, 3e38], ids=["nan", "inf", "huge"])
def test_a_poison_push_is_refused_counted_and_the_center_stays_whole(shared: bool, poison: float) -> None:
    """Proves: a push holding a NaN, an Inf or a finite 3e38 (which decodes fine) is refused
    with its own status, counted as "nonfinite", and never reaches the center; its task's
    exchange is not applied, so a retry of it is applied once; other workers go on."""
    from pipeline.train.ps import protocol as p

    with ParameterServer(np.zeros(N, np.float32), secret=SECRET, shared_memory=shared) as server:
        bad = np.ones(N, np.float32)
        bad[17] = poison
        task = p.task_key("t", 0, 0)
        with Client(server.address, secret=SECRET, worker=0, size=N) as c:
            assert c.begin(task, steps=1, window=1) == 0
            c.pull()
            with pytest.raises(ProtocolError, match="nonfinite"):
                c.push_pull(bad)
        with Client(server.address, secret=SECRET, worker=0, size=N) as c:  # the retry
            assert c.begin(task, steps=1, window=1) == 0
            c.pull()
            assert c.push_pull(np.ones(N, np.float32)).tolist() == [1.0] * N
        assert server.stats()["refused"] == {"nonfinite": 1}
        assert np.isfinite(server.weights()).all() and server.clock == 1
        assert server.applied(task) == (1, 1)
