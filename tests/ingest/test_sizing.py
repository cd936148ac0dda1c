"""Trigger sizing for a freshness target against a simulated trainer: a batch of ``n``
records takes ``fixed_s + n / rate`` seconds (trigger, checkpoint and commit, then compute),
fed by a producer whose rate changes (a burst), or a trainer whose rate does (a core lost)."""

from __future__ import annotations

import bisect

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.ingest.sizing import Sizing, TriggerSizer

TARGET = 2.0


def _simulate(
    sizer: TriggerSizer | None,
    *,
    produce: list[tuple[float, float]],
    train: list[tuple[float, float]],
    fixed_s: float = 0.4,
    max_rows: int = 20_000,
    step_s: float = 0.05,
    noise: float = 0.0,
) -> dict[str, np.ndarray]:
    """Run triggers back to back (an empty one polls again after ``step_s``) over phases of
    ``(seconds, records/s)`` produced, with the trainer's rate ``(from second, records/s)``;
    return the model's freshness sampled every ``step_s``, and each batch's start and size.
    ``noise``: each batch's time times a lognormal factor of that sigma (seeded), as a shared
    machine's cycles vary."""
    rng = np.random.default_rng(0)
    ends = np.cumsum([d for d, _ in produce])
    counts = np.concatenate([[0.0], np.cumsum([d * r for d, r in produce])])

    def produced(t: float) -> float:  # records written by time t
        i = min(bisect.bisect_right(ends, t), len(produce) - 1)
        return float(min(counts[-1], counts[i] + (t - (ends[i] - produce[i][0])) * produce[i][1]))

    def written_at(k: float) -> float:  # when record k was written (its timestamp)
        i = min(bisect.bisect_right(counts, k) - 1, len(produce) - 1)
        return float(ends[i] - produce[i][0] + (k - counts[i]) / produce[i][1])

    t, done, learned_at = 0.0, 0.0, None
    samples, starts, sizes = [], [], []
    while t < ends[-1]:
        pending = int(produced(t) - done)
        size = sizer.plan(now=t, pending=pending) if sizer is not None else max_rows
        n = min(size, pending)
        rate = [r for since, r in train if since <= t][-1]
        took = (fixed_s + n / rate) * rng.lognormal(0.0, noise) if n else step_s
        for s in np.arange(
            t, t + took, step_s
        ):  # the center holds the last batch's data until this one ends
            samples.append(s - learned_at if learned_at is not None else np.nan)
        if n:
            starts.append(t)
            sizes.append(n)
            done += n
            learned_at = written_at(done - 1)
        t += took
    return {
        "freshness": np.array(samples),
        "starts": np.array(starts),
        "sizes": np.array(sizes),
        "step": np.array(step_s),
    }


def _window(run: dict[str, np.ndarray], start: float, end: float) -> np.ndarray:
    step = float(run["step"])
    return run["freshness"][int(start / step) : int(end / step)]


def _recovery_s(run: dict[str, np.ndarray], since: float, until: float) -> float:
    """Seconds after ``since`` until the model is back under the target for good."""
    over = np.flatnonzero(_window(run, since, until) > TARGET)
    return (over[-1] + 1) * float(run["step"]) if len(over) else 0.0


def test_a_burst_grows_the_batches_and_they_shrink_back_after_it() -> None:
    """Proves: at 2,000 records/s into a trainer of 12,000/s with 0.4 s of fixed costs per
    batch, the target keeps the model under 2 s fresh (p99); in a 10x burst of 30 s the
    batches grow to the upper bound, the model is back under the target within a minute of
    its end, as soon as with fixed 20,000-record batches (sizing costs no throughput on a
    backlog), and the batches are small again after it."""
    phases = [(60.0, 2000.0), (30.0, 20_000.0), (120.0, 2000.0)]
    sized = _simulate(
        TriggerSizer(Sizing(TARGET, 500, 20_000)), produce=phases, train=[(0.0, 12_000.0)]
    )
    fixed = _simulate(None, produce=phases, train=[(0.0, 12_000.0)])
    steady = np.concatenate([_window(sized, 10, 60), _window(sized, 160, 210)])
    assert np.nanpercentile(steady, 99) <= TARGET, np.nanpercentile(steady, 99)
    in_burst = sized["sizes"][(sized["starts"] > 60) & (sized["starts"] < 90)]
    assert in_burst.max() == 20_000  # grew to the bound while the lag built
    back, fixed_back = _recovery_s(sized, 90, 210), _recovery_s(fixed, 90, 210)
    assert 0 < back <= 60 and back <= fixed_back + 2, (back, fixed_back)
    assert sized["sizes"][sized["starts"] > 190].max() < 5000  # shrunk back after the burst


def test_caught_up_it_takes_all_waiting_and_a_backlog_drains_in_full_batches() -> None:
    """Proves: where the trainer keeps up but its cycles vary (±25%, as on a shared machine;
    3,100 records/s, 0.45 s of fixed costs), a trigger that finds no more than its size waiting
    takes all of it, so the target's p99 is the same as fixed batches' (a cap below what waits
    would leave records a whole cycle more); and on a 60,000-record backlog every batch is
    full, as many batches as with fixed ones (no halving before the backlog is gone)."""
    steady = [(240.0, 2000.0)]
    kw = {"train": [(0.0, 3100.0)], "fixed_s": 0.45, "noise": 0.25}
    sized = _simulate(TriggerSizer(Sizing(TARGET, 500, 20_000)), produce=steady, **kw)
    fixed = _simulate(None, produce=steady, **kw)
    p99, fixed_p99 = (np.nanpercentile(_window(r, 30, 240), 99) for r in (sized, fixed))
    assert p99 <= fixed_p99 * 1.05, (p99, fixed_p99)
    backlog = [(0.01, 6_000_000.0), (30.0, 1e-6)]  # 60,000 records at once, then nothing
    drained = _simulate(TriggerSizer(Sizing(TARGET, 500, 20_000)), produce=backlog, **kw)
    assert list(drained["sizes"][:3]) == [20_000] * 3, drained["sizes"][:4]


def test_the_size_follows_a_trainer_that_slows_down_and_the_lag_stays_bounded() -> None:
    """Proves: when the training rate halves (5,000 to 2,500 records/s, a core taken) at a
    steady 2,000/s, the sizer's measured rate follows, batches grow to what keeps up, and
    the model's freshness settles instead of growing without end."""
    sizer = TriggerSizer(Sizing(TARGET, 500, 20_000))
    run = _simulate(sizer, produce=[(240.0, 2000.0)], train=[(0.0, 5000.0), (60.0, 2500.0)])
    assert sizer.rate is not None and sizer.rate < 2600  # the measured rate fell with the trainer's
    late = _window(run, 180, 240)
    assert np.nanmax(late) < 2 * np.nanmax(_window(run, 120, 180)) + 1  # settled, not growing
    assert run["sizes"][run["starts"] > 180].max() < 20_000


@pytest.mark.parametrize(
    ("target", "low", "high", "said"),
    [
        (0.0, 1, 10, "--freshness-target > 0"),
        (2.0, 0, 10, "1 <= --min-offsets-per-trigger <= --max-offsets-per-trigger"),
        (2.0, 50, 10, "Received: 50 and 10"),
    ],
)
def test_bad_bounds_are_one_line(target: float, low: int, high: int, said: str) -> None:
    with pytest.raises(ConfigError, match=said.replace("+", r"\+")):
        Sizing(target, low, high)


def test_the_python_source_sizes_each_trigger_from_sparks_options(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Proves: the target reaches streamtrain's source through Spark's options (whose keys
    are case-insensitive), and each ``latestOffset`` plans at most the sizer's size, spread
    over the partitions: the upper bound on a backlog, half of it once caught up, back up
    while records are left behind."""
    from types import SimpleNamespace

    from pyspark.sql.datasource import CaseInsensitiveDict

    from pipeline.ingest import spark_source

    clock = [0.0]
    monkeypatch.setattr(spark_source, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    options = CaseInsensitiveDict(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "subscribe": "t",
            **Sizing(TARGET, 100, 1000).options(),
        }
    )
    reader = spark_source.KafkaStreamReader(options)
    assert reader.sizer is not None and reader.sizer.sizing == Sizing(TARGET, 100, 1000)
    log_end = {"t": {"0": 10_000, "1": 10_000}}
    monkeypatch.setattr(reader, "_edges", lambda which: log_end)

    def trigger(start: dict, after_s: float) -> tuple[dict, int]:  # type: ignore[type-arg]
        clock[0] += after_s
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        return end, sum(end["t"][p] - start["t"][p] for p in ("0", "1"))

    end, planned = trigger({"t": {"0": 0, "1": 0}}, 0.0)
    assert planned == 1000 and end == {
        "t": {"0": 500, "1": 500}
    }  # nothing measured: the upper bound
    log_end = {"t": {"0": 550, "1": 550}}  # 100 waiting after 10 s: caught up, at 100 records/s
    end, planned = trigger(end, 10.0)
    assert planned == 100 and reader.sizer.size == 500
    log_end = {"t": {"0": 5000, "1": 5000}}  # a burst: more waits than the size, which doubles
    end, planned = trigger(end, 1.0)
    assert planned == 1000 and end == {"t": {"0": 1050, "1": 1050}}
    _, planned = trigger(end, 1.0)
    assert planned == 1000  # the upper bound holds
