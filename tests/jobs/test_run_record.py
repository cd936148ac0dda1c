"""The run record (issue 32): `streamtrain run --resume DIR` alone continues the run recorded in
DIR; an option given again that defines the run must agree, before anything starts; a
checkpoint another model wrote is refused in one line; serve and predict read the same record."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline import codec
from pipeline.errors import ConfigError
from pipeline.jobs import run_record
from pipeline.jobs.run_config import RunConfig
from pipeline.train import checkpoint
from pipeline.train.model import ModelSpec
from tests.cli import exit_code

ROOT = Path(__file__).resolve().parents[2]


def test_every_run_config_field_says_whether_it_defines_the_run() -> None:
    """Proves: the table is the whole RunConfig, so a new setting fails here until classified."""
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    assert fields - set(run_record.ROLES) == set(), "classify these in run_record.ROLES"
    assert set(run_record.ROLES) - fields == set(), "these are no RunConfig field any more"
    assert set(run_record.ROLES.values()) == {
        run_record.DEFINES,
        run_record.KEPT,
        run_record.SESSION,
    }


def _recorded(folder: Path, **settings: Any) -> Path:
    """A stopped run's folder: its record (as the run wrote it at its start) and a checkpoint."""
    folder.mkdir(parents=True)
    run_record.write(folder, dataclasses.asdict(RunConfig(out=str(folder), **settings)))
    checkpoint.save(folder, checkpoint.State(np.zeros(10, np.float32), clock=1, last_batch_id=0))
    return folder


class _Report:
    out = "folder"
    time_shares: dict[str, float] = {}

    def summary(self) -> str:
        return "trained"


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[RunConfig]:
    """The RunConfig each `streamtrain run` in this process would start (nothing starts)."""
    from pipeline.jobs import online

    runs: list[RunConfig] = []
    monkeypatch.setattr(online, "run", lambda cfg: runs.append(cfg) or _Report())
    monkeypatch.delenv("STREAMTRAIN_BOOTSTRAP", raising=False)
    monkeypatch.delenv("STREAMTRAIN_MASTER", raising=False)
    return runs


@pytest.mark.parametrize("dataset", ["mnist", "higgs"])
def test_resume_alone_continues_the_recorded_run(
    dataset: str, tmp_path: Path, started: list[RunConfig]
) -> None:
    """Proves: `--resume DIR` alone takes every option from the record (the issue's HIGGS run
    resumed as MNIST's CNN), and not the session's own bounds."""
    folder = _recorded(
        tmp_path / "run",
        dataset=dataset,
        algorithm="adag",
        workers=3,
        batch_size=64,
        epochs=2,
        bootstrap="127.0.0.1:19092",
        seed=7,
        rate=500.0,
        until_accuracy=0.9,
        max_batches=1,
        timeout_s=5.0,
    )
    assert exit_code("run", "--resume", str(folder)) == 0
    (cfg,) = started
    assert (
        cfg.dataset,
        cfg.algorithm,
        cfg.workers,
        cfg.batch_size,
        cfg.epochs,
        cfg.bootstrap,
        cfg.seed,
    ) == (dataset, "adag", 3, 64, 2, "127.0.0.1:19092", 7)
    assert (cfg.rate, cfg.until_accuracy) == (500.0, 0.9)  # kept
    assert (cfg.max_batches, cfg.timeout_s) == (
        None,
        None,
    )  # the first session's bounds, not this one's
    assert cfg.resume and Path(cfg.out or "").resolve() == folder.resolve()


def test_options_that_agree_or_may_change_apply(tmp_path: Path, started: list[RunConfig]) -> None:
    folder = _recorded(
        tmp_path / "run", dataset="higgs", epochs=2, bootstrap="127.0.0.1:19092", rate=500.0
    )
    assert (
        exit_code(
            "run",
            "--resume",
            str(folder),
            "--dataset",
            "higgs",
            "--bootstrap",
            "127.0.0.1:19092",
            "--epochs",
            "3",
            "--rate",
            "100",
            "--timeout",
            "30",
        )
        == 0
    )
    (cfg,) = started
    assert (cfg.dataset, cfg.epochs, cfg.rate, cfg.timeout_s) == ("higgs", 3, 100.0, 30.0)


def test_resume_if_exists_with_the_same_command_line_continues(
    tmp_path: Path, started: list[RunConfig]
) -> None:
    """Proves: the compose trainer's restart (same command line, --resume-if-exists) goes on."""
    line = [
        "run",
        "--dataset",
        "mnist",
        "--bootstrap",
        "kafka:9092",
        "--topic",
        "streamtrain-mnist",
        "--workers",
        "2",
        "--metrics-port",
        "9108",
        "--out",
        str(tmp_path / "run"),
        "--resume-if-exists",
        "--serve-port",
        "8501",
        "--model",
        "tests/jobs/user_model.py:build",
    ]
    assert exit_code(*line) == 0
    (first,) = started
    assert not first.resume
    _recorded(
        tmp_path / "run",
        **{k: v for k, v in dataclasses.asdict(first).items() if k not in ("out", "resume")},
    )
    assert exit_code(*line) == 0
    assert (
        started[1].resume
        and started[1].serve_port == 8501
        and started[1].topic == "streamtrain-mnist"
    )


def test_an_option_that_disagrees_is_refused_in_one_line_before_anything_starts(
    tmp_path: Path,
) -> None:
    """Proves: another dataset or algorithm given to a resume is refused with the recorded and
    the given value, before the broker, Spark or the model start."""
    folder = _recorded(tmp_path / "run", dataset="higgs", bootstrap="127.0.0.1:1")
    before = (folder / checkpoint.FILENAME).read_bytes()
    began = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            "--resume",
            str(folder),
            "--dataset",
            "mnist",
            "--algorithm",
            "adag",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("streamtrain: error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert (
        "recorded --dataset higgs, given mnist; recorded --algorithm sync, given adag" in errors[0]
    )
    assert "Traceback" not in done.stderr and "start-up" not in done.stdout
    assert "embedded Kafka at" not in done.stderr and "metrics at" not in done.stderr
    assert time.monotonic() - began < 60
    assert (folder / checkpoint.FILENAME).read_bytes() == before


def test_a_changed_model_file_is_refused(tmp_path: Path, started: list[RunConfig]) -> None:
    model = tmp_path / "model.py"
    model.write_text((ROOT / "tests/jobs/user_model.py").read_text())
    folder = _recorded(
        tmp_path / "run", dataset="higgs", model=f"{model}:build", bootstrap="127.0.0.1:19092"
    )
    model.write_text(model.read_text() + "\n# a new layer, say\n")
    with pytest.raises(ConfigError, match="model file of the run .* changed since it started"):
        run_record.resume_options(folder, {"model": None}, set())


def test_a_folder_without_a_record_resumes_with_the_options_given(
    tmp_path: Path, started: list[RunConfig], caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "old"
    checkpoint.save(folder, checkpoint.State(np.zeros(10, np.float32)))
    assert (
        exit_code(
            "run", "--resume", str(folder), "--dataset", "higgs", "--bootstrap", "127.0.0.1:19092"
        )
        == 0
    )
    assert started[0].dataset == "higgs"
    assert [r.message for r in caplog.records if "has no run.json" in r.message], caplog.text


def _older_run(folder: Path, schema: dict[str, Any]) -> Path:
    """A run folder written before run.json existed: its checkpoint and its model.json."""
    checkpoint.save(folder, checkpoint.State(np.zeros(10, np.float32), clock=1, last_batch_id=0))
    (folder / "model.json").write_text(
        json.dumps({"name": schema["name"], "spec": {}, "schema": schema})
    )
    return folder


def test_a_folder_older_than_records_resumes_the_dataset_its_model_json_names(
    tmp_path: Path, started: list[RunConfig]
) -> None:
    """Proves (issue 41, item 5): `--resume DIR` alone continues the dataset model.json names
    (it started MNIST's Kafka, Spark and workers before refusing HIGGS's checkpoint); a
    --dataset that disagrees, or a table with no file given, is one line before anything starts."""
    from pipeline.serve.predictor import schema_dict

    folder = _older_run(tmp_path / "old", schema_dict(codec.HIGGS))
    assert exit_code("run", "--resume", str(folder), "--bootstrap", "127.0.0.1:19092") == 0
    assert started[-1].dataset == "higgs" and started[-1].resume
    with pytest.raises(ConfigError, match="trained higgs .*given --dataset mnist: drop --dataset"):
        run_record.resume_options(folder, {"dataset": "mnist"}, {"dataset"})
    table = _older_run(
        tmp_path / "table",
        {**schema_dict(codec.HIGGS), "name": "penguins", "table": {"features": [{"name": "a"}]}},
    )
    with pytest.raises(ConfigError, match="trained a table of yours .*pass its --data FILE"):
        run_record.resume_options(table, {"dataset": "mnist"}, set())


def test_a_checkpoint_another_model_wrote_is_refused_naming_both_sizes() -> None:
    """Proves: the issue's HIGGS checkpoint under MNIST's CNN is one line, never the reshape's
    traceback in the optimizer."""
    state = checkpoint.State(np.zeros(189_902, np.float32), optimizer={"iterations": np.array(3)})
    with pytest.raises(
        ConfigError, match=r"holds 189,902 weights, the model has 1,048,853: another model wrote it"
    ):
        checkpoint.check_fits(state, 1_048_853, "runs/higgs")
    checkpoint.check_fits(state, 189_902, "runs/higgs")


def test_another_model_than_the_recorded_one_is_refused(tmp_path: Path) -> None:
    spec = ModelSpec("{}", "adam", "mse", ((2, 3), (3,)))
    run_record.describe_model(tmp_path, spec=spec, schema=codec.HIGGS, name="higgs")
    run_record.describe_model(
        tmp_path, spec=spec, schema=codec.HIGGS, name="higgs"
    )  # the same: fine
    other = ModelSpec('{"a": 1}', "adam", "mse", ((2, 3), (3,)))
    with pytest.raises(
        ConfigError, match=f"recorded fingerprint {spec.fingerprint} .*now {other.fingerprint}"
    ):
        run_record.describe_model(tmp_path, spec=other, schema=codec.HIGGS, name="higgs")


def test_serve_and_predict_read_the_record(tmp_path: Path) -> None:
    """Proves: the model's description is part of the run's record, and older folders' model.json
    still serves."""
    from pipeline.serve import predictor

    spec = ModelSpec("{}", "adam", "mse", ((2, 3), (3,)))
    run_record.write(tmp_path, dataclasses.asdict(RunConfig(dataset="higgs")))
    run_record.describe_model(tmp_path, spec=spec, schema=codec.HIGGS, name="higgs")
    assert predictor.read_description(tmp_path) == ("higgs", spec, codec.HIGGS)
    record = json.loads((tmp_path / run_record.RECORD_FILE).read_text())
    assert record["settings"]["dataset"] == "higgs" and record["fingerprint"] == spec.fingerprint
    old = tmp_path / "old"
    old.mkdir()
    (old / predictor.MODEL_FILE).write_text(
        json.dumps(predictor.description(spec, codec.MNIST, "mnist"))
    )
    assert predictor.read_description(old) == ("mnist", spec, codec.MNIST)


@pytest.mark.slow  # two real runs
def test_a_higgs_run_stopped_after_a_batch_resumes_with_its_folder_alone(tmp_path: Path) -> None:
    """Proves: the issue's night: `run --dataset higgs --epochs 2 --bootstrap B --out DIR` killed
    after its first batches, then `run --resume DIR` alone: HIGGS again (not MNIST's CNN), its
    replay sends what the topic lacks, and every one of the 14,000 records is trained once,
    the run stopping by itself.

    Slow: a broker of its own (Apache Kafka's JVM) and two runs of `streamtrain run`, each
    starting Spark, the parameter server and TensorFlow workers: two epochs of HIGGS killed
    after batch 1's commit, then the resume that trains the rest of the 14,000 records and stops
    by itself."""
    from pipeline.ingest.kafka import EmbeddedBroker
    from pipeline.train.ledger import check_ledger

    out = tmp_path / "run"
    with EmbeddedBroker(log_path=tmp_path / "broker.log") as broker:
        killed = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipeline",
                "run",
                "--dataset",
                "higgs",
                "--epochs",
                "2",
                "--bootstrap",
                broker.bootstrap,
                "--max-offsets-per-trigger",
                "2000",
                "--eval-every",
                "100",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=400,
            cwd=ROOT,
            env={**_env(), "STREAMTRAIN_FAULT": "committed:1"},
        )
        assert "fault injection: killed at committed:1" in killed.stdout, killed.stderr[-3000:]
        stopped = checkpoint.load(out)
        assert stopped is not None and 0 < stopped.extra["trained"] < 14_000
        done = subprocess.run(
            [sys.executable, "-m", "pipeline", "run", "--resume", str(out)],
            capture_output=True,
            text=True,
            timeout=400,
            cwd=ROOT,
            env=_env(),
        )
    assert done.returncode == 0, done.stderr[-3000:]
    first = next(line for line in done.stdout.splitlines() if line.startswith("start-up"))
    assert "higgs found" in first, done.stdout[:2000]
    final = checkpoint.load(out)
    assert (
        final is not None
        and final.weights.size == 28 * 300 + 300 + 2 * (300 * 300 + 300) + 300 * 2 + 2
    )
    ends = check_ledger(final.ledger)
    assert sum(ends.values()) == 14_000 == final.extra["trained"]
    report = json.loads((out / "report.json").read_text())
    assert report["stopped_because"] == "all produced records trained"
    assert report["trained_this_session"] == 14_000 - stopped.extra["trained"]


def _env() -> dict[str, str]:
    import os

    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("STREAMTRAIN_BOOTSTRAP", "STREAMTRAIN_FAULT")
    }


@pytest.mark.slow  # starts Spark and describes the model
def test_a_folder_without_a_record_resumed_under_another_model_stops_in_one_line(
    tmp_path: Path,
    broker,  # type: ignore[no-untyped-def]
    topic: str,
) -> None:
    """Proves: the issue's traceback (a HIGGS checkpoint loaded into MNIST's CNN, a reshape
    error in the optimizer) is one line naming both sizes, where no record can catch it
    first (a folder older than records)."""
    folder = tmp_path / "old"
    checkpoint.save(
        folder,
        checkpoint.State(
            np.zeros(189_902, np.float32),
            clock=3,
            last_batch_id=0,
            optimizer={
                "iterations": np.array(3),
                "m": np.zeros(189_902, np.float32),
                "v": np.zeros(189_902, np.float32),
            },
        ),
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            "--resume",
            str(folder),
            "--dataset",
            "mnist",
            "--bootstrap",
            broker.bootstrap,
            "--topic",
            topic,
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
        env=_env(),
    )
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("streamtrain: error: The checkpoint")
        and "holds 189,902 weights, the model has 1,048,853" in last
    ), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert not (
        folder / run_record.RECORD_FILE
    ).exists()  # the wrong options were not recorded as the run's
