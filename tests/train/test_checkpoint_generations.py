"""Checkpoint generations: the last K kept, a damaged file named with the way on, a rewind
to an earlier one (Spark's logs with it), a model that diverged stopped before its save,
and one run per output folder."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.errors import ConfigError, DataError, StreamtrainError
from pipeline.train import checkpoint
from pipeline.train.driver import TrainDriver
from pipeline.train.ps import ParameterServer
from pipeline.train.rows import BatchRow
from tests.conftest import ROOT


def _save_batches(folder: Path, n: int, keep: int = 3) -> None:
    for b in range(n):
        checkpoint.save(
            folder,
            checkpoint.State(
                np.full(4, b, np.float32),
                clock=b,
                last_batch_id=b,
                ledger=[[b, "t", 0, b * 10, b * 10 + 10]],
            ),
            keep=keep,
        )


def test_the_last_k_generations_are_kept_and_a_rewind_takes_sparks_logs_back(
    tmp_path: Path,
) -> None:
    """Proves: with keep=3 the generations of batches 3, 4, 5 stay; a rewind to 4 makes it
    state.npz, drops generation 5, and Spark's offset and commit logs forget batch 5 (so
    Spark plans it again from batch 4's offsets)."""
    _save_batches(tmp_path, 6)
    assert checkpoint.generations(tmp_path) == [3, 4, 5]
    spark = tmp_path / "spark-checkpoint"
    for log in ("offsets", "commits"):
        (spark / log).mkdir(parents=True)
        for b in range(6):
            (spark / log / str(b)).write_text("v1\n")
            (spark / log / f".{b}.crc").write_bytes(b"x")
    state = checkpoint.rewind(tmp_path, 4, spark)
    assert state.last_batch_id == 4
    back = checkpoint.load(tmp_path)
    assert back is not None and back.last_batch_id == 4 and back.weights.tolist() == [4.0] * 4
    assert checkpoint.generations(tmp_path) == [3, 4]
    for log in ("offsets", "commits"):
        assert sorted(p.name for p in (spark / log).iterdir()) == sorted(
            [str(b) for b in range(5)] + [f".{b}.crc" for b in range(5)]
        )
    with pytest.raises(DataError, match="Expected generation 9 .* Received: generations 3, 4"):
        checkpoint.load(tmp_path, generation=9)


@pytest.mark.parametrize(
    "damage, what", [(lambda b: b[: len(b) // 2], "truncated"), (lambda b: b"", "empty")]
)
def test_a_damaged_state_is_one_line_naming_it_and_the_newest_intact_generation(
    tmp_path: Path, damage, what
) -> None:  # type: ignore[no-untyped-def]
    """Proves: a truncated or empty state.npz (and its hard-linked generation, the same
    file) is a DataError naming the file and what is wrong, offering the newest intact
    generation; the CLI says it in one line, no traceback, and resuming that generation works."""
    _save_batches(tmp_path, 3)
    state = tmp_path / checkpoint.FILENAME
    state.write_bytes(damage(state.read_bytes()))  # in place: generation 2 is the same inode
    with pytest.raises(DataError) as e:
        checkpoint.load(tmp_path)
    message = str(e.value)
    assert str(state) in message and what in message and "--generation 1" in message, message
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", "run", "--dataset", "mnist", "--resume", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("streamtrain: error:")]
    assert len(errors) == 1 and "--generation 1" in errors[0], done.stderr[-3000:]
    rewound = checkpoint.rewind(tmp_path, 1, tmp_path / "spark-checkpoint")
    assert rewound.last_batch_id == 1 and checkpoint.load(tmp_path) is not None


def test_a_second_run_on_one_folder_is_refused(tmp_path: Path) -> None:
    """Proves: while one process holds the folder, a run there stops with one line naming
    the holder (no second writer of one checkpoint); the lock goes with its holder."""
    _save_batches(tmp_path, 1)
    with checkpoint.lock(tmp_path):
        with pytest.raises(ConfigError, match="another run is writing"), checkpoint.lock(tmp_path):
            pass
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "run",
                "--dataset",
                "mnist",
                "--resume",
                str(tmp_path),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert "another run is writing" in done.stderr, done.stderr[-3000:]
    with checkpoint.lock(tmp_path):  # released
        pass


def _row(loss: float | None) -> BatchRow:
    return BatchRow(
        batch_id=7,
        t=0,
        rows=1,
        trained=1,
        rejected={},
        batch_s=0,
        lag=0,
        staleness_p50=None,
        staleness_p99=None,
        clock=1,
        compute_s=0,
        exchange_s=0,
        prequential_loss=loss,
    )


@pytest.mark.parametrize("loss, weights", [(math.nan, 0.0), (math.inf, 0.0), (0.5, math.nan)])
def test_a_model_that_diverged_stops_before_its_save(
    tmp_path: Path, loss: float, weights: float
) -> None:
    """Proves: a NaN or Inf prequential loss, or a center that is not finite, stops the batch
    with one line that offers the newest kept generation; a sound batch passes."""
    _save_batches(tmp_path, 3)
    with ParameterServer(np.zeros(4, np.float32), secret=b"s") as server:
        driver = TrainDriver(server, folder=tmp_path)
        driver.check_finite(7, np.zeros(4, np.float32), _row(0.5))
        with pytest.raises(
            StreamtrainError,
            match=r"Batch 7: the model diverged .* --generation 2 \(kept: 0, 1, 2\)",
        ):
            driver.check_finite(7, np.full(4, weights, np.float32), _row(loss))


def test_a_collapsed_heldout_score_stops_and_keeps_the_last_sound_generation(
    tmp_path: Path,
) -> None:
    """Proves: a held-out accuracy that falls back to the majority class's (after the model
    had learned) on two scores in a row stops the batch with one line offering the
    generation of the best score, which stays kept although older than the last 3;
    the watch's record goes on across a resume (a fresh driver on the saved state)."""
    from pipeline.ingest.batch_figures import BatchFigures
    from pipeline.ingest.offsets import OffsetRange

    y = np.array([0] * 600 + [1] * 400)  # the majority class scores 0.6, on 1,000 records
    accuracy = {0: 0.7, 1: 0.9, 2: 0.92, 3: 0.91, 4: 0.62, 5: 0.61}

    def score(info: BatchFigures, row: BatchRow, weights: np.ndarray) -> None:
        row.heldout = {"accuracy": accuracy[info.batch_id]}

    with ParameterServer(np.zeros(4, np.float32), secret=b"s") as server:
        driver = TrainDriver(
            server, checkpoint.State(np.zeros(4, np.float32)), folder=tmp_path, on_row=score
        )
        driver.watch_heldout(y, regression=False)
        for b in range(5):  # batch 4 scores low once: not yet a collapse
            driver.on_batch(
                BatchFigures(batch_id=b, ranges=[OffsetRange("t", 0, b * 10, b * 10 + 10)])
            )
        with pytest.raises(StreamtrainError) as e:
            driver.on_batch(BatchFigures(batch_id=5, ranges=[OffsetRange("t", 0, 50, 60)]))
        # A resumed driver goes on from what the checkpoint recorded of the scores.
        state = checkpoint.load(tmp_path)
        assert state is not None and state.last_batch_id == 5
        resumed = TrainDriver(server, state, folder=tmp_path)
        resumed.watch_heldout(y, regression=False)
        assert resumed.watch is not None and (resumed.watch.best, resumed.watch.best_batch) == (
            0.92,
            2,
        )
    message = str(e.value)
    assert (
        "Batch 5: the model collapsed (held-out accuracy 0.6100 after 0.9200 at batch 2" in message
    ), message
    assert (
        "majority class scores 0.6000" in message and "--generation 2 (kept: 2, 3, 4, 5)" in message
    ), message
    for b in range(6, 9):  # the best generation outlives the last 3
        checkpoint.save(
            tmp_path, checkpoint.State(np.zeros(4, np.float32), last_batch_id=b), pinned=2
        )
    assert checkpoint.generations(tmp_path) == [2, 6, 7, 8]
    for b in range(9, 12):  # and each pinned from just before a drift (issue 45) beside it
        checkpoint.save(
            tmp_path, checkpoint.State(np.zeros(4, np.float32), last_batch_id=b), pinned=[2, 6]
        )
    assert checkpoint.generations(tmp_path) == [2, 6, 9, 10, 11]


def test_a_model_that_never_learned_is_not_a_collapse() -> None:
    """Proves: scores that never rose above the trivial predictor's by the watch's margin
    (a hard stream, or the first batches) stop nothing; nor does one low score."""
    from pipeline.train.divergence import HeldoutWatch

    watch = HeldoutWatch.for_labels(np.array([0, 1] * 50), regression=False)
    assert all(
        watch.observe(b, {"accuracy": a}) is None
        for b, a in enumerate([0.5, 0.52, 0.49, 0.53, 0.5, 0.48])
    )
    rmse = HeldoutWatch.for_labels(
        np.array([0.0, 10.0] * 1000), regression=True
    )  # predicting the mean: 5.0
    assert rmse.observe(0, {"rmse": 2.0}) is None and rmse.observe(1, {"rmse": 4.9}) is None
    assert "held-out rmse 5.1000 after 2.0000" in str(rmse.observe(2, {"rmse": 5.1}))


def test_an_absurd_finite_loss_is_a_model_that_diverged(tmp_path: Path) -> None:
    """Proves: a prequential loss 10,000 times what predicting without the features costs
    (a learning rate that blew the weights up to 1e30, still finite) stops the batch before
    its save; a loss under the bound passes, and without a watch nothing is bounded."""
    with ParameterServer(np.zeros(4, np.float32), secret=b"s") as server:
        driver = TrainDriver(server, folder=tmp_path)
        driver.check_finite(
            7, np.zeros(4, np.float32), _row(1e9)
        )  # no watch: --no-divergence-check
        driver.watch_heldout(np.array([0, 1, 1]), regression=False)
        driver.check_finite(7, np.zeros(4, np.float32), _row(16.0))
        with pytest.raises(
            StreamtrainError,
            match=r"Batch 7: the model diverged \(prequential loss 1e\+09, over "
            r"10,000 times .* 0\.6931\).* start again",
        ):
            driver.check_finite(7, np.zeros(4, np.float32), _row(1e9))


@pytest.mark.parametrize(
    ("accuracy", "majority", "n"),
    [
        (0.60, 0.53, 500),
        (0.66, 0.53, 500),
        (0.70, 0.5, 1000),
        (0.985, 0.11, 10_000),
        (0.80, 0.5, 100),
    ],
)
def test_a_stationary_stream_never_stops_and_flipped_labels_do(
    accuracy: float, majority: float, n: int
) -> None:
    """Proves: 2,000 held-out scores of a model that stays as good as it is (each a binomial
    sample on ``n`` records: the noise a small held-out split shows) stop nothing, HIGGS's
    500-record split included; the same model once its labels flip (accuracy 1 - p, or
    chance for many classes) stops within two scores wherever the split can tell."""
    from pipeline.train.divergence import HeldoutWatch

    rng = np.random.default_rng(7)
    classes = 2 if majority >= 0.5 else 10
    watch = HeldoutWatch("accuracy", baseline=majority, n=n)
    scores = rng.binomial(n, accuracy, size=2_000) / n
    assert [s for b, s in enumerate(scores) if watch.observe(b, {"accuracy": float(s)})] == []
    flipped = (1 - accuracy) if classes == 2 else 1 / classes
    fired = [
        watch.observe(2_000 + b, {"accuracy": float(rng.binomial(n, flipped) / n)})
        for b in range(2)
    ]
    if (
        watch._low_gain(watch.best or 0) >= watch.min_gain
    ):  # the split tells a learned model from chance
        assert fired[0] is None and fired[1] is not None and "held-out accuracy" in fired[1]
    else:
        assert fired == [None, None] and n <= 500, (
            watch
        )  # too few records to tell: the watch stays quiet
