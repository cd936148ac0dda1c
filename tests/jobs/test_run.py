"""`streamtrain run`, the main job, end to end: real broker, Spark, parameter server and
TensorFlow."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

from pipeline.train import checkpoint
from pipeline.train.ledger import check_ledger
from producers import Replay, datasets
from tests.conftest import SOURCES

ROOT = Path(__file__).resolve().parents[2]
#: An environment variable a test gives its runs, to tell their processes from other tests'.
MARK = "STREAMTRAIN_TEST_MARK"


def _cli(
    *args: str, timeout: float = 400, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=None if env is None else {**os.environ, **env},
    )


def _ledger_total(ledger: list[list]) -> int:  # type: ignore[type-arg]
    check_ledger(ledger)
    return sum(end - start for _, _, _, start, end in ledger)


#: Where the driver is killed (STREAMTRAIN_FAULT), in the order one run and its resumes meet
#: them, and the last batch its checkpoint holds then: inside batch 2 before its state is
#: saved, after batch 5's save and before Spark's commit, after batch 8's commit.
BOUNDARIES = (("batch", 2, 1), ("saved", 5, 5), ("committed", 8, 8))


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES)
def test_a_driver_killed_at_each_boundary_of_a_batch_resumes_every_record_once(
    broker,
    topic,
    tmp_path,  # type: ignore[no-untyped-def]
    data_dir,
    source,
) -> None:
    """Proves: SIGKILL of the driver inside a batch before its state is saved ("batch"),
    after the save and before Spark's commit ("saved"), and after the commit ("committed"),
    each followed by --resume (one run killed three times, so that the replays chain; with
    Spark's own source, at the last two):
    every record is trained exactly once (the ledger chains with no gap and no overlap, and
    sums to what was produced), and only after "saved" is the replayed batch skipped, once
    its ranges match the checkpoint's; each resumed run's first line says which batch Spark
    starts with and why, and removes the temporary files the kill left. Then a Spark
    checkpoint reset beside the state is refused with one line instead of skipping batches it
    never ran.

    Slow: per source, one run killed at each boundary and resumed in one chain (three kills with
    the Python source, two with Spark's own), each a fresh `streamtrain run` starting Spark, the
    parameter server and TensorFlow workers over 500-record batches; the resume that finishes
    streams until its 25 s --timeout (the topic is the test's: no end is known), and one more
    start is refused."""
    produced = (
        Replay(
            datasets.get("higgs", data_dir=data_dir),
            bootstrap=broker.bootstrap,
            topic=topic,
            partitions=2,
        )
        .run()
        .records_sent
    )
    out = tmp_path / "run"
    # 500 records a batch: 14 batches, so the last fault (after batch 8) falls mid-stream.
    common = [
        "--dataset",
        "higgs",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
        "--max-offsets-per-trigger",
        "500",
        "--eval-every",
        "100",
        "--source",
        source,
    ]
    folder = ["--out", str(out)]  # the first run's; each resumed run names it with --resume
    previous_skip = None  # the batch the run before was killed after saving, if any
    killed_at = None
    # The runs' temp folder: each killed run leaves its files there; the next start removes them.
    temp = Path(tempfile.mkdtemp(prefix="st-kill-"))
    said = ""  # what Spark starts with, as the next run should say it
    # Inside a batch, before its save, both sources restart alike (Spark runs the batch its
    # offset log planned): the Python source's run covers it. After the save and after the
    # commit is where a source's offsets and the checkpoint must agree: both sources run those.
    for point, batch, saved in BOUNDARIES if source == "python" else BOUNDARIES[1:]:
        killed = _cli(
            "run",
            *common,
            *folder,
            env={"STREAMTRAIN_FAULT": f"{point}:{batch}", "TMPDIR": str(temp)},
        )
        assert killed.returncode == -signal.SIGKILL, (point, killed.stderr[-3000:])
        assert f"fault injection: killed at {point}:{batch}" in killed.stdout
        assert said in killed.stdout, (said, killed.stdout[:600])
        assert (
            len(list(temp.glob("streamtrain-*/run-*"))) == 1
        )  # its own, left by the kill; the one before is gone
        # Killed inside a batch, Spark runs it with the offsets it planned; after its save, Spark
        # replays it and the checkpoint skips it; after Spark's commit (the next batch planned,
        # not begun), Spark runs the next.
        said = {
            "batch": f"Spark runs batch {batch} with the offsets it had planned before the stop",
            "saved": f"Spark replays batch {batch}, which it had not committed: the checkpoint "
            "holds it, so it is skipped",
            "committed": f"Spark runs batch {batch + 1} with the offsets it had planned before "
            "the stop",
        }[point]
        skipped = re.findall(r"batch (\d+) was applied before a restart: skipped", killed.stderr)
        assert skipped == ([] if previous_skip is None else [str(previous_skip)]), (point, skipped)
        previous_skip = batch if point == "saved" else None
        killed_at = checkpoint.load(out)
        assert killed_at is not None and killed_at.last_batch_id == saved, point
        # The default algorithm keeps Adam on the server: its state is saved with each batch's
        # weights, and each resumed run continued it rather than starting Adam afresh.
        assert int(killed_at.optimizer["iterations"]) == killed_at.clock, point
        folder = ["--resume", str(out)]
    assert killed_at is not None

    done = _cli("run", *common, *folder, "--timeout", "25", env={"TMPDIR": str(temp)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert said in done.stdout, (said, done.stdout[:600])
    assert [p.name for p in temp.rglob("*")] == [f"streamtrain-{os.getuid()}"]  # all gone
    shutil.rmtree(temp)
    assert "was applied before a restart: skipped" not in done.stderr  # committed: Spark moved on
    final = checkpoint.load(out)
    assert final is not None
    ends = check_ledger(final.ledger)  # no gap, no overlap, across the crashes
    assert ends == {(topic, 0): produced // 2, (topic, 1): produced - produced // 2}
    assert _ledger_total(final.ledger) == produced == final.extra["trained"]
    assert len(final.ledger) <= 2 * 2  # compacted: a range per partition, and the newest batch's
    assert final.clock > killed_at.clock
    assert int(final.optimizer["iterations"]) == final.clock
    report = json.loads((out / "report.json").read_text())
    assert report["trained_records"] == produced
    assert report["trained_this_session"] == produced - killed_at.extra["trained"]
    # The default HIGGS model, as the workers saved it at the end.
    assert (
        keras_model_params(out / "model.keras")
        == 28 * 300 + 300 + 2 * (300 * 300 + 300) + 300 * 2 + 2
    )

    shutil.rmtree(out / "spark-checkpoint")  # Spark would start over at batch 0
    again = _cli("run", *common, *folder, "--timeout", "25")
    assert again.returncode != 0
    assert "does not belong with state.npz" in again.stderr, again.stderr[-3000:]
    assert checkpoint.load(out).extra["trained"] == produced  # type: ignore[union-attr]


@pytest.mark.slow  # a full run
def test_a_user_model_file_trains_and_the_driver_never_imports_tensorflow(tmp_path: Path) -> None:
    # TensorFlow costs a process half a gigabyte: the model is described in a child
    # process, and scored and saved on the workers. Four workers on a machine with fewer
    # cores: each still gets a task slot of its own.
    script = (
        "import sys; from pipeline.jobs.online import Run, RunConfig; r = "
        "Run(RunConfig(dataset='higgs', model='tests/jobs/user_model.py:build', workers=4, "
        "max_batches=2, max_offsets_per_trigger=3500, eval_every=1, "
        f"out={str(tmp_path / 'run')!r})).execute(); print('heldout', "
        "r.batches[-1].heldout['accuracy'], 'final', r.final['accuracy']); print('tensorflow "
        "loaded:', 'tensorflow' in sys.modules, 'keras loaded:', 'keras' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tensorflow loaded: False keras loaded: False" in done.stdout
    # The held-out score after the last batch (one Spark job) is the final one (another).
    heldout, final = re.search(r"^heldout (\S+) final (\S+)$", done.stdout, re.M).groups()  # type: ignore[union-attr]
    assert heldout == final and 0 < float(final) <= 1
    assert keras_model_params(tmp_path / "run" / "model.keras") == 28 * 32 + 32 + 32 * 2 + 2
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["trained_records"] == 7000 and np.isfinite(report["final"]["auc"])
    assert report["parallelism"]["concurrent_replicas"] == 4 <= report["parallelism"]["task_slots"]


def keras_model_params(path: Path) -> int:
    import keras

    return int(keras.models.load_model(path).count_params())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "tests/jobs/user_model.py:nope"], "has no function 'nope'"),
        pytest.param(  # builds the model in a process that imports TensorFlow: 7 s
            ["--model", "tests/jobs/user_model.py:not_a_model"],
            "returned int, not a Keras model",
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ["--model", "tests/jobs/user_model.py:broken"],
            "Building the model failed (ValueError: no layer called Dense3000)",
            marks=pytest.mark.slow,
        ),
        (["--model", "missing.keras"], "Expected a Keras model file at missing.keras"),
        (
            ["--model", "tests/jobs/user_model.py"],
            "Expected --model FILE.py:BUILD_FN or FILE.keras",
        ),
        (["--algorithm", "sgd9000"], "Unknown algorithm 'sgd9000'"),
        (["--workers", "0"], "Expected --workers >= 1"),
        (["--ps-shards", "0"], "Expected --ps-shards >= 1"),
        (["--drift", "warmpu=1"], "Expected --drift KEY=VALUE pairs, KEY one of adapt_lr_scale"),
        (
            ["--source", "jvm", "--broker-engine", "tansu"],
            "--source jvm reads short of the end on the embedded Tansu broker",
        ),
        (
            ["--source", "jvm", "--freshness-target", "2"],
            "--freshness-target sizes batches in streamtrain's Python source",
        ),
        pytest.param(  # retried for 5 s, as a broker that is starting would be
            ["--bootstrap", "127.0.0.1:1"],
            "Cannot reach Kafka at 127.0.0.1:1",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_bad_options_fail_fast_with_one_clear_line(
    args: list[str], message: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    done = _cli("run", "--dataset", "higgs", "--out", str(tmp_path / "run"), *args, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("streamtrain: error:")]
    assert len(errors) == 1 and message in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 60
    # Found before anything started (or, for a model that fails to build, cleaned up):
    # no output folder is left behind.
    assert not (tmp_path / "run").exists()
    if "returned int" not in message and "Building the model failed" not in message:
        assert "embedded Kafka at" not in done.stderr and "metrics at" not in done.stderr, (
            done.stderr[-2000:]
        )


def test_source_jvm_without_its_jars_says_so_in_one_line(tmp_path: Path) -> None:
    """No cached jars and no Maven Central (here a closed port as the mirror): one line
    naming what was needed and what to do, before the broker or the replay start."""
    done = _cli(
        "run",
        "--dataset",
        "higgs",
        "--source",
        "jvm",
        "--bootstrap",
        "127.0.0.1:1",
        "--out",
        str(tmp_path / "run"),
        env={
            "STREAMTRAIN_CACHE_DIR": str(tmp_path / "cache"),
            "STREAMTRAIN_MAVEN_REPO": "http://127.0.0.1:1/maven2/",
        },
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("streamtrain: error:")]
    assert len(errors) == 1, done.stderr[-2000:]
    assert "Expected Spark's own Kafka source (--source jvm)'s jars" in errors[0], errors
    assert "STREAMTRAIN_MAVEN_REPO" in errors[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists() and "Cannot reach Kafka" not in done.stderr


@pytest.mark.slow  # a whole run on Apache Kafka's broker
def test_a_run_on_apache_kafka_with_spark_s_own_source_trains_every_record_once(
    tmp_path: Path,
) -> None:
    """`streamtrain run --broker-engine kafka --source jvm --dataset higgs`: the run's own
    Apache Kafka, Spark's own Kafka source (its jars from the cache) and the replay of the
    7,000-record sample, to the end: every record trained once, and the ledger one range per
    partition from offset 0, chained over the batches (one chained range per partition)."""
    out = tmp_path / "run"
    done = _cli(
        "run",
        "--broker-engine",
        "kafka",
        "--source",
        "jvm",
        "--dataset",
        "higgs",
        "--max-offsets-per-trigger",
        "2000",
        "--eval-every",
        "100",
        "--out",
        str(out),
        timeout=400,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["settings"]["source"] == "jvm"
    assert report["stopped_because"] == "all produced records trained", report["stopped_because"]
    assert report["trained_records"] == 7000 == report["trained_this_session"]
    assert len(report["batches"]) >= 4  # 2,000 a batch, split between the partitions
    ends = check_ledger(report["ledger"])  # chained: no gap, no overlap
    assert set(ends) == {(report["topic"], 0), (report["topic"], 1)}
    assert sum(ends.values()) == 7000
    firsts = {(t, p): start for _, t, p, start, _ in reversed(report["ledger"])}
    assert set(firsts.values()) == {0}  # each partition's chain starts at its first offset


def test_a_finished_run_is_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / checkpoint.FILENAME).write_bytes(b"")
    done = _cli("run", "--dataset", "higgs", "--out", str(tmp_path / "run"), timeout=120)
    assert done.returncode == 2 and "pass --resume to continue it" in done.stderr
    os.remove(tmp_path / "run" / checkpoint.FILENAME)


@pytest.mark.parametrize("algorithm", ["downpour", "averaging", "aeasgd"])
def test_window_sets_every_algorithms_communication_window(algorithm: str, tmp_path: Path) -> None:
    from pipeline.jobs.online import Run, RunConfig

    run = Run(RunConfig(algorithm=algorithm, communication_window=3, out=str(tmp_path / "run")))
    assert run.algorithm.communication_window == 3


def test_without_window_each_algorithm_keeps_its_own(tmp_path: Path) -> None:
    from pipeline.jobs.online import Run, RunConfig
    from pipeline.train import algorithms

    for name in ("sync", "downpour", "aeasgd"):
        run = Run(RunConfig(algorithm=name, out=str(tmp_path / name)))
        assert run.algorithm.communication_window == algorithms.get(name).communication_window
    assert Run(RunConfig(out=str(tmp_path / "default"))).algorithm.name == "sync"


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.mark.slow  # a full run
def test_a_driver_killed_outright_leaves_no_replay_or_model_server(tmp_path: Path) -> None:
    """Proves: SIGKILL of `streamtrain run` (no clean-up runs) still ends its replay producer
    and its model server: each asked the kernel to stop it when its parent dies."""
    log = tmp_path / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline",
                "run",
                "--dataset",
                "higgs",
                "--rate",
                "200",
                "--serve-port",
                "0",
                "--out",
                str(tmp_path / "run"),
            ],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        while "serving predictions at" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        spawned = [pid for pid in _children(proc.pid) if "multiprocessing" in _cmdline(pid)]
        assert len(spawned) >= 2, [
            _cmdline(p) for p in _children(proc.pid)
        ]  # the replay and the model server
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while [p for p in spawned if Path(f"/proc/{p}").exists() and "multiprocessing" in _cmdline(p)]:
        assert time.monotonic() < deadline, [_cmdline(p) for p in spawned]
        time.sleep(0.2)


def _shard_processes(mark: str) -> list[int]:
    """Shard processes of this checkout's Python started by runs whose environment holds
    ``MARK=mark`` (a run's, however it ended): not another test's, which may run beside."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            if b"pipeline.train.shard_process" not in cmdline:
                continue
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[0].startswith(str(ROOT).encode()) and f"{MARK}={mark}".encode() in environ:
            found.append(int(proc.name))
    return found


@pytest.mark.slow  # two short runs
def test_a_run_on_two_parameter_server_shards_resumes_on_one(
    broker, topic, tmp_path, data_dir
) -> None:  # type: ignore[no-untyped-def]
    """Proves: `streamtrain run --ps-shards 2` trains through two shard processes (each
    batch's checkpoint one cut of both, every task's count agreed by both), and its
    checkpoint resumes on one server (--ps-shards may change between sessions): Adam's
    state goes on (a step per clock tick), every record is trained once, and no shard
    process outlives the run.

    Slow: two runs of `streamtrain run` (Spark, TensorFlow workers, the parameter server as two
    shard processes, then one): three 1,000-record batches on two shards, then the resume on
    one, which streams until its 30 s --timeout (the topic is the test's: no end is known)."""
    produced = (
        Replay(
            datasets.get("higgs", data_dir=data_dir),
            bootstrap=broker.bootstrap,
            topic=topic,
            partitions=2,
        )
        .run()
        .records_sent
    )
    out = tmp_path / "run"
    common = [
        "--dataset",
        "higgs",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
        "--max-offsets-per-trigger",
        "1000",
        "--eval-every",
        "100",
    ]
    mark = {MARK: uuid.uuid4().hex}  # inherited by the runs' shard processes, so found
    first = _cli(
        "run", *common, "--out", str(out), "--ps-shards", "2", "--max-batches", "3", env=mark
    )
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["parameter_server"]["shards"] == 2 and report["trained_records"] == 3000
    assert json.loads((out / "run.json").read_text())["settings"]["ps_shards"] == 2
    saved = checkpoint.load(out)
    assert (
        saved is not None
        and saved.last_batch_id >= 2
        and int(saved.optimizer["iterations"]) == saved.clock > 0
    )
    assert saved.optimizer["m"].size == saved.weights.size  # the shards' slices joined

    done = _cli(
        "run", *common, "--resume", str(out), "--ps-shards", "1", "--timeout", "30", env=mark
    )
    assert done.returncode == 0, done.stderr[-3000:]
    final = checkpoint.load(out)
    assert final is not None and int(final.optimizer["iterations"]) == final.clock > saved.clock
    assert _ledger_total(final.ledger) == produced == final.extra["trained"]
    assert json.loads((out / "report.json").read_text())["parameter_server"]["shards"] == 1
    assert not _shard_processes(mark[MARK])
