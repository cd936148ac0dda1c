"""The drift signals (issue 45): each fires within a bound on a stream with a planted change,
and none fires on a stationary stream (fixed seeds, bounded loops)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import types
from typing import Any

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.ingest.offsets import OffsetRange
from pipeline.train import adapt, detectors, drift

SEEDS = range(5)


def _learning_curve(rng: np.random.Generator, n: int, *, floor: float = 0.1) -> np.ndarray:
    """Mini-batch losses of a model that learns: from ln(10) down to ``floor``, with noise."""
    level = floor + (math.log(10) - floor) * np.exp(-np.arange(n) / (n / 8))
    return np.maximum(0.0, level + rng.normal(0, 0.04 + 0.2 * level, n))


@pytest.mark.parametrize("seed", SEEDS)
def test_loss_signal_never_fires_on_a_stationary_stream(seed: int) -> None:
    """Proves: a model learning and then settled on an unchanging stream (300,000 records in
    mini-batches of 64) raises no loss drift: a fall is no alarm, and the noise is chance."""
    rng = np.random.default_rng(seed)
    d = detectors.LossDrift()
    losses = _learning_curve(rng, 300_000 // 64)
    fired = [d.update(losses[i : i + 20].tolist(), size=64) for i in range(0, len(losses), 20)]
    assert not [f for f in fired if f is not None]


@pytest.mark.parametrize("seed", SEEDS)
def test_loss_signal_fires_soon_after_an_abrupt_change(seed: int) -> None:
    """Proves: when the loss jumps (labels permuted at record 60,000), the loss signal fires
    within 2,000 records of the change, once, with the rise as its statistic."""
    rng = np.random.default_rng(seed)
    d = detectors.LossDrift()
    before = _learning_curve(rng, 60_000 // 64)
    after = _learning_curve(rng, 40_000 // 64, floor=0.3) + 0.4  # relearning from a higher loss
    losses = np.concatenate([before, after])
    hits = []
    for i in range(0, len(losses), 10):
        hit = d.update(losses[i : i + 10].tolist(), size=64)
        if hit is not None:
            hits.append(((i + 10) * 64, hit))  # the records seen when it fired
    assert len(hits) == 1, hits
    at, (rise, detail) = hits[0]
    assert 60_000 <= at <= 62_000 and rise > 1.5 and "prequential loss" in detail


def test_loss_signal_sees_a_real_learner_meet_concept_drift() -> None:
    """Proves, on River's SEA stream with a real online learner (scaled logistic regression;
    log loss and error rate per mini-batch of 64, in tasks of 1,024 records): the concept
    switching at record 30,000 fires the loss signal within 5,000 records; the same stream
    without the switch never fires it."""
    from river import linear_model, optim, preprocessing
    from river.datasets import synth

    def run(stream: Any) -> list[int]:
        model = preprocessing.StandardScaler() | linear_model.LogisticRegression(
            optimizer=optim.SGD(0.05)
        )
        d, losses, errors, fired = detectors.LossDrift(warmup=5_000), [], [], []
        batch: list[tuple[float, float]] = []
        for i, (x, y) in enumerate(stream):
            p = min(max(model.predict_proba_one(x).get(True, 0.5), 1e-7), 1 - 1e-7)
            batch.append((-math.log(p if y else 1 - p), float((p > 0.5) != y)))
            model.learn_one(x, y)
            if len(batch) == 64:  # a mini-batch's mean loss and error rate
                losses.append(float(np.mean([b[0] for b in batch])))
                errors.append(float(np.mean([b[1] for b in batch])))
                batch = []
            if len(losses) == 16:  # a task of 1,024 records
                if d.update(losses, size=64, errors=errors) is not None:
                    fired.append(i)
                losses, errors = [], []
        return fired

    # An abrupt switch chained by hand: River's ConceptDriftStream overflows math.exp at width 1.
    drifting = itertools.chain(
        synth.SEA(variant=0, seed=1).take(30_000), synth.SEA(variant=3, seed=2).take(20_000)
    )
    fired = run(drifting)
    assert fired and 30_000 <= fired[0] <= 35_000, fired
    assert run(synth.SEA(variant=0, seed=1).take(50_000)) == []


def _task_errors(
    rng: np.random.Generator, p: float, *, minibatches: int = 16, size: int = 64
) -> list[float]:
    """One task's mini-batch error rates when each record is wrong with probability ``p``."""
    return (rng.binomial(size, min(p, 1.0), minibatches) / size).tolist()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("level", [0.01, 0.05, 0.3])
def test_error_signal_never_fires_on_a_stationary_stream(seed: int, level: float) -> None:
    """Proves: a model that learns down to an error rate of ``level`` and stays there, over
    300,000 records in tasks of 1,024 (losses steady), raises no drift."""
    rng = np.random.default_rng(seed)
    d = detectors.LossDrift()
    for task in range(300):
        p = level + (0.9 - level) * math.exp(-task / 20)
        hit = d.update([0.3] * 16, size=64, errors=_task_errors(rng, p))
        assert hit is None, (task, hit)


@pytest.mark.parametrize("seed", SEEDS)
def test_error_signal_sees_a_short_sharp_rise(seed: int) -> None:
    """Proves: the rise a table model showed at SEA's abrupt change (its error from 0.044 to
    0.127 for two thousand records, its loss by 1.24x: under Page-Hinkley's 1.5x, too short
    for ADWIN) fires within the first task after the change."""
    rng = np.random.default_rng(seed)
    d = detectors.LossDrift()
    for _ in range(30):
        assert d.update([0.2] * 16, size=64, errors=_task_errors(rng, 0.044)) is None
    hit = d.update([0.25] * 16, size=64, errors=_task_errors(rng, 0.127))
    assert hit is not None and hit[0] > 1.5 and "prequential error" in hit[1]


@pytest.mark.parametrize("seed", SEEDS)
def test_prior_signal_fires_on_a_moved_class_prior_and_never_on_a_stationary_one(seed: int) -> None:
    """Proves: class counts drawn from one prior for 200,000 records never fire; a prior
    that moves (a class three times as common) fires within two windows of the change."""
    rng = np.random.default_rng(seed)
    p0 = np.full(10, 0.1)
    p1 = np.array([0.3, *np.full(9, 0.7 / 9)])
    d = detectors.CountsDrift()
    for _ in range(200):
        assert d.update(rng.multinomial(1_000, p0)) is None
    hits = [i for i in range(10) if d.update(rng.multinomial(1_000, p1)) is not None]
    assert hits and hits[0] <= 3


@pytest.mark.parametrize("seed", SEEDS)
def test_feature_signal_names_the_column_that_moved(seed: int) -> None:
    """Proves: samples of a 5-column table (one one-hot column) never fire while their
    distribution holds; a shift of one column by half its spread fires within two windows
    and names that column."""
    rng = np.random.default_rng(seed)
    names = ["a", "b", "c", "d", "onehot"]

    def rows(shift: float) -> np.ndarray:
        x = rng.normal(0, 1, (256, 5))
        x[:, 2] += shift
        x[:, 4] = rng.random(256) < 0.3
        return x

    d = detectors.FeatureDrift(names)
    for _ in range(400):
        assert d.update(rows(0.0), records=1_000) is None
    hits = [d.update(rows(0.5), records=1_000) for _ in range(10)]
    found = [h for h in hits if h is not None]
    assert found and found[0][1] == "c" and hits.index(found[0]) <= 8


@dataclasses.dataclass
class _Result:
    """A task's result as the drift signals read it."""

    records: int
    preq_losses: list[float]
    label_counts: list[int] | None = None
    sample_x: np.ndarray | None = None
    heldout_x: np.ndarray | None = None
    heldout_y: np.ndarray | None = None


def test_watch_reports_batch_offsets_and_position() -> None:
    """Proves: a drift names its signal, its batch, the stream position before the batch,
    the batch's offsets per partition and its statistic; the watch's state keeps every drift
    and a watch made from it (a resumed run) goes on from them."""
    rng = np.random.default_rng(0)
    w = drift.DriftWatch(
        classes=2, columns=None, settings=drift.DriftSettings(warmup=2_000, cooldown=2_000)
    )
    found = []
    for batch in range(40):
        level = 0.2 if batch < 30 else 1.5
        results = [
            _Result(1_000, (level + rng.normal(0, 0.03, 16)).tolist(), [500, 500]) for _ in range(2)
        ]
        ranges = [OffsetRange("t", p, batch * 1_000, (batch + 1) * 1_000) for p in (0, 1)]
        found += w.observe(batch, results, drift.offsets_of(ranges), batch_size=64)
    assert [(d.signal, d.batch_id, d.records) for d in found] == [("loss", 30, 60_000)]
    assert (
        found[0].offsets == {"t:0": [30_000, 31_000], "t:1": [30_000, 31_000]}
        and found[0].statistic > 2
    )
    again = drift.DriftWatch(classes=2, columns=None, found=w.state())
    assert [d.batch_id for d in again.found] == [30]


class _Algorithm:
    """An algorithm's server half, as the raise of the learning rate uses it."""

    def __init__(self) -> None:
        self.scales: list[float] = []

    def scale_learning_rate(self, scale: float) -> bool:
        self.scales.append(scale)
        return True


class _Evaluation:
    def __init__(self) -> None:
        self.used: list[int] = []
        self.suspended = 0

    def use(self, x: np.ndarray, y: np.ndarray) -> None:
        self.used.append(len(y))

    def suspend(self) -> None:
        self.suspended += 1


@dataclasses.dataclass
class _Driver:
    watch: Any = "held-out watch"
    state: Any = None


@dataclasses.dataclass
class _Handler:
    holdout_every: int = 0
    lr_scale: float = 1.0
    passes: int = 1
    replay: int = 0


@dataclasses.dataclass
class _Info:
    batch_id: int
    results: list[Any]
    ranges: list[OffsetRange]
    again: Any = None


@dataclasses.dataclass
class _Row:
    drifts: list[Any] = dataclasses.field(default_factory=list)
    held_out: int = 0
    trained: int = 1_000


@pytest.mark.parametrize("mode", adapt.MODES)
def test_response_holds_out_records_after_a_drift_and_adapt_raises_the_learning_rate(
    mode: str,
) -> None:
    """Proves: on a drift, either mode stops scoring the split from before it, holds records
    out from then on, scores the newest window of them once there are enough, and re-arms
    the collapse check on them; only ``adapt`` raises the learning rate (the server's and the
    replicas') and trains each task's records ``adapt_passes`` times, for ``adapt_records``
    records, then puts both back; and only ``adapt`` runs the drift's batch again, once, at
    the raised rate, ``adapt_replay`` passes over it, as a replay (the handler as it was
    after), handing the replay's results back for the driver to check. Each drift says what
    was done."""
    rng = np.random.default_rng(1)
    algorithm, handler, evaluation = _Algorithm(), _Handler(), _Evaluation()
    settings = drift.DriftSettings(
        warmup=2_000,
        cooldown=50_000,
        adapt_lr_scale=4.0,
        adapt_records=5_000,
        adapt_passes=3,
        adapt_replay=6,
    )
    replays: list[tuple[int, int, int, float]] = []

    def again(batch: int) -> Any:
        def run() -> list[Any]:  # the batch's tasks, run again with the handler as set now
            replays.append((batch, handler.passes, handler.replay, handler.lr_scale))
            return [types.SimpleNamespace(result=_Result(950, []))]

        return run

    r = adapt.DriftResponse(
        drift.DriftWatch(classes=2, columns=None, settings=settings),
        mode,
        handler=handler,
        batch_size=64,
        window=300,
        algorithm=algorithm,
    )
    r.evaluation = evaluation
    driver, drifted, scales, passes = _Driver(), [], [], []
    for batch in range(45):
        level = 0.2 if batch < 30 else 1.5
        held = bool(handler.holdout_every)  # the tasks hold records out once the handler says so
        results = [
            _Result(
                1_000,
                (level + rng.normal(0, 0.03, 16)).tolist(),
                [500, 500],
                heldout_x=np.zeros((50, 2)) if held else None,
                heldout_y=np.zeros(50, np.int64) if held else None,
            )
        ]
        row = _Row()
        replayed = r.on_batch(
            _Info(
                batch,
                results,
                [OffsetRange("t", 0, batch * 1_000, (batch + 1) * 1_000)],
                again(batch),
            ),
            row,
            driver,
        )
        assert [x.records for x in replayed] == (
            [950] if replays and replays[-1][0] == batch else []
        )
        drifted += [batch] * len(row.drifts)
        scales.append(handler.lr_scale)
        passes.append(handler.passes)
        assert row.held_out == (50 if held else 0)
    assert drifted in ([30], [31])
    assert handler.holdout_every == adapt.HOLDOUT_EVERY and evaluation.suspended == 1
    assert (
        evaluation.used and evaluation.used[0] == adapt.MIN_WINDOW and max(evaluation.used) == 300
    )
    assert driver.watch is not None and driver.watch != "held-out watch"  # a fresh collapse check
    if (
        mode == "adapt"
    ):  # raised at the drift's batch, through the 5,000 records after it, then back
        assert (
            algorithm.scales == [4.0, 1.0] and scales.count(4.0) == 5 and scales[drifted[0]] == 4.0
        )
        assert scales[-1] == 1.0 and passes == [3 if s == 4.0 else 1 for s in scales]
        assert replays == [(drifted[0], 6, 1, 4.0)] and handler.replay == 0
        [found] = r.watch.found
        assert found.reaction == {
            "mode": "adapt",
            "lr_scale": 4.0,
            "passes": 3,
            "records": 5_000,
            "replay_passes": 6,
            "replayed": 950,
            "replay_s": found.reaction["replay_s"],
        }
    else:
        assert algorithm.scales == [] and set(scales) == {1.0} and set(passes) == {1}
        assert replays == [] and [d.reaction for d in r.watch.found] == [{"mode": "alert"}]


def test_a_replay_that_fails_leaves_the_handler_as_the_reaction_set_it() -> None:
    """Proves: when the replay's tasks raise (the batch then fails, and is trained again on
    resuming), the handler the next tasks travel with is not left in replay mode or at the
    replay's passes."""
    handler = _Handler(passes=4)
    response = adapt.DriftResponse(
        drift.DriftWatch(classes=2, columns=None),
        "adapt",
        handler=handler,
        batch_size=64,
    )

    def failing() -> list[Any]:
        assert handler.replay == 1 and handler.passes == 8
        raise RuntimeError("an executor lost")

    with pytest.raises(RuntimeError, match="executor lost"):
        response._replay(failing, 8)
    assert handler.replay == 0 and handler.passes == 4


def test_a_resumed_run_keeps_the_raise_that_adapt_set() -> None:
    """Proves (issue 57, item 6): a run stopped while ``adapt``'s raise was in force resumes
    with the raise, the server's and the replicas', and the passes, for the records it had
    left, then goes back to the configured rate and one pass; a raise that had ended stays
    ended."""
    settings = drift.DriftSettings(
        warmup=2_000, cooldown=50_000, adapt_lr_scale=4.0, adapt_records=5_000
    )

    def response(algorithm: _Algorithm, handler: _Handler) -> adapt.DriftResponse:
        watch = drift.DriftWatch(classes=2, columns=None, settings=settings)
        return adapt.DriftResponse(
            watch, "adapt", handler=handler, batch_size=64, algorithm=algorithm
        )

    rng = np.random.default_rng(3)
    first = response(_Algorithm(), _Handler())
    for batch in range(33):  # the drift at batch 30 or 31, then a batch or two of the raise
        level = 0.2 if batch < 30 else 1.5
        results = [_Result(1_000, (level + rng.normal(0, 0.03, 16)).tolist(), [500, 500])]
        info = _Info(batch, results, [OffsetRange("t", 0, batch * 1_000, (batch + 1) * 1_000)])
        first.on_batch(info, _Row(), _Driver())
    kept = json.loads(json.dumps(first.state()))  # as the checkpoint holds it
    assert kept["lr_scale"] == 4.0 and 0 < kept["boost_left"] < 5_000, kept
    algorithm, handler = _Algorithm(), _Handler()
    resumed = response(algorithm, handler)
    resumed.resumed(_Driver(), kept)
    assert handler.lr_scale == 4.0 and algorithm.scales == [4.0] and handler.passes == 4
    resumed._wind_down(kept["boost_left"])  # the records it had left, trained
    assert handler.lr_scale == 1.0 and algorithm.scales == [4.0, 1.0] and handler.passes == 1
    ended = response(_Algorithm(), _Handler())
    ended.resumed(_Driver(), resumed.state())
    assert ended.handler.lr_scale == 1.0 and ended.algorithm.scales == []


def test_settings_refuse_an_unknown_key_in_one_line() -> None:
    """Proves: a bad --drift pair is refused before anything starts, naming what it takes."""
    with pytest.raises(ConfigError, match="KEY one of adapt_lr_scale.*Received: 'warmup=-3'"):
        drift.DriftSettings.parse("warmup=-3")
    assert drift.DriftSettings.parse("prior_threshold=0.05").prior_threshold == 0.05


def test_metrics_count_each_signal_from_zero_and_a_resume_goes_on() -> None:
    """Proves: every signal's series exists at 0 before any drift (rate() sees the first),
    a drift counts under its signal with its time, and a resumed run's counter goes on from
    the drifts its checkpoint lists (a run's counter, not the process's)."""
    from prometheus_client import generate_latest

    from pipeline.jobs.run_metrics import RunMetrics
    from pipeline.train.checkpoint import State

    def scrape(m: RunMetrics) -> str:
        return generate_latest(m.meters.registry).decode()

    m = RunMetrics(dataset="d", algorithm="sync", topic="t", workers=2)
    text = scrape(m)
    assert all(
        f'streamtrain_drift_detected_total{{signal="{s}"}} 0.0' in text for s in drift.SIGNALS
    )
    assert "streamtrain_drift_last_timestamp_seconds NaN" in text
    found = drift.Drift("prior", 3, 6_000, 0.4, "class prior PSI 0.400", at=1_700_000_000.0)
    m.on_drift([found])
    assert 'streamtrain_drift_detected_total{signal="prior"} 1.0' in scrape(m)
    assert "streamtrain_drift_last_timestamp_seconds 1.7e+09" in scrape(m)
    resumed = RunMetrics(dataset="d", algorithm="sync", topic="t", workers=2)
    resumed.restore(
        State(np.zeros(2, np.float32), last_batch_id=5, extra={"drift": [found.to_dict()] * 2}),
        "/nonexistent",
    )
    assert 'streamtrain_drift_detected_total{signal="prior"} 2.0' in scrape(resumed)


def test_tasks_describe_labels_a_table_sample_and_the_held_out_records() -> None:
    """Proves: a task's result carries its class counts, a sample of a float table's rows
    (at most SAMPLE_ROWS, none for images) and the records it held out."""
    from pipeline import codec
    from pipeline.train.handler import _describe
    from pipeline.train.partition import TaskResult

    def result() -> TaskResult:
        return TaskResult(0, 0, 0, 0, 0.0, 0.0, [], 0.0, 0.0, False)

    x, y = np.random.default_rng(0).random((1_000, 28), dtype=np.float32), np.arange(1_000) % 2
    r = result()
    _describe(r, codec.HIGGS, x, y, (x[:5], y[:5]))
    assert (
        r.label_counts == [500, 500]
        and r.sample_x is not None
        and len(r.sample_x) == drift.SAMPLE_ROWS
    )
    assert r.held_out == 5 and r.heldout_x is not None and len(r.heldout_x) == 5
    images = result()
    _describe(images, codec.MNIST, np.zeros((10, 784), np.uint8), np.arange(10), None)
    assert images.sample_x is None and images.label_counts == [1] * 10 and images.held_out == 0


def test_the_driver_saves_the_drifts_keeps_the_generation_before_and_counts_held_out_records(
    tmp_path: Any,
) -> None:
    """Proves, through a real parameter server and the exactly-once driver: the batch that
    shows a drift carries it on its row; the checkpoint records it (a resumed run's metrics
    and report go on from it) and keeps the generation from just before it however many
    come after; records held out since count as handled (the run's stop rule) but not as
    trained."""
    from pipeline.ingest.batch_figures import BatchFigures
    from pipeline.train import checkpoint
    from pipeline.train.driver import TrainDriver
    from pipeline.train.partition import TaskResult
    from pipeline.train.ps import ParameterServer

    rng = np.random.default_rng(3)
    handler, rows = _Handler(), []
    watch = drift.DriftWatch(
        classes=2, columns=None, settings=drift.DriftSettings(warmup=2_000, cooldown=50_000)
    )
    with ParameterServer(np.zeros(4, np.float32), secret=b"s") as server:
        driver = TrainDriver(
            server,
            checkpoint.State(np.zeros(4, np.float32)),
            folder=tmp_path,
            keep=3,
            on_row=lambda info, row, weights: rows.append(row),
        )
        driver.watch_drift(adapt.DriftResponse(watch, "alert", handler=handler, batch_size=64))
        for b in range(40):
            held = 50 if handler.holdout_every else 0
            result = TaskResult(
                0,
                1_000 - held,
                0,
                0,
                0.0,
                0.0,
                [],
                0.0,
                0.0,
                False,
                preq_losses=((0.2 if b < 30 else 1.5) + rng.normal(0, 0.03, 16)).tolist(),
                heldout_x=np.zeros((held, 2)),
                heldout_y=np.zeros(held, np.int64),
                held_out=held,
            )
            driver.on_batch(
                BatchFigures(
                    batch_id=b,
                    ranges=[OffsetRange("t", 0, b * 1_000, (b + 1) * 1_000)],
                    results=[result],
                )
            )
    [found] = [(row.batch_id, d) for row in rows for d in row.drifts]
    assert found[0] in (30, 31) and found[1].generation == found[0] - 1
    state = checkpoint.load(tmp_path)
    assert state is not None and [d["batch_id"] for d in state.extra["drift"]] == [found[0]]
    assert checkpoint.generations(tmp_path) == [found[0] - 1, 37, 38, 39]
    held_out = sum(row.held_out for row in rows)
    assert held_out == 50 * (39 - found[0]) and state.extra["held_out"] == held_out
    assert driver.handled == 40_000 and driver.trained == 40_000 - held_out
