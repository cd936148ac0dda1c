"""Training on your own data, end to end: the own-data guide's commands as written (a CSV with
strings and gaps, to served predictions on raw instances), a numeric target, topics that
confluent-kafka's producer fills with JSON and Avro records, and the model's contract."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from pipeline.table import TableSchema, encode_rows
from pipeline.table.writers import encode_values
from producers.datasets.table import SAMPLES
from producers.datasets.table_files import read_rows
from tests import docblocks
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
PENGUINS = SAMPLES / "penguins" / "penguins.csv"
MODELS = Path(__file__).with_name("penguin_models.py")


def _cli(*args: str, cwd: Path = ROOT, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


def _guide_commands() -> list[str]:
    """The own-data guide's commands, as its block holds them (tests/docblocks.py)."""
    return docblocks.commands(docblocks.run_block("docs/own-data.md", __file__))


def _wait_http(url: str, proc: subprocess.Popen[str], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the model server exited"
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer in {timeout_s} s")


@pytest.mark.slow  # a run and a model server
def test_the_guides_own_data_commands_run_as_written(tmp_path: Path) -> None:
    """Proves: sample, infer, run, serve and curl, exactly as docs/own-data.md says, in an empty
    folder (the port a free one); the served answer for a raw instance (strings included) is
    the saved model's on the schema's transform of it."""
    commands = _guide_commands()
    assert [c.split()[:2] for c in commands[:4]] == [
        ["streamtrain", "data"],
        ["streamtrain", "schema"],
        ["streamtrain", "run"],
        ["streamtrain", "serve"],
    ]
    assert commands[4].startswith("curl") and len(commands) == 5
    port = str(free_port())
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for line in commands[:3]:
        done = subprocess.run(
            shlex.split(line), capture_output=True, text=True, timeout=400, cwd=tmp_path, env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert (
        tmp_path / "penguins.csv"
    ).read_bytes() == PENGUINS.read_bytes()  # the sample, copied out
    report = json.loads((tmp_path / "runs/penguins/report.json").read_text())
    assert (
        report["final"]["accuracy"] > 0.9
        and report["trained_records"] > 0
        and report["rejected_records"] == 0
    )
    serve = shlex.split(commands[3].rstrip("& ").replace("8501", port))
    proc = subprocess.Popen(
        serve, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/v1/models/penguins", proc)
        curl = shlex.split(commands[4].replace("8501", port))
        body = json.loads(curl[curl.index("-d") + 1])
        if shutil.which("curl"):
            answer = json.loads(
                subprocess.run(curl, capture_output=True, text=True, timeout=30, check=True).stdout
            )
        else:  # the same request without curl
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/models/penguins:predict",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            answer = json.loads(urllib.request.urlopen(request, timeout=30).read())
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    import keras

    schema = TableSchema.load(tmp_path / "penguins.schema.json")
    model = keras.models.load_model(tmp_path / "runs/penguins/model.keras", compile=False)
    expected = model.predict(encode_rows(body["instances"], schema), verbose=0)
    assert np.allclose(answer["predictions"], expected, atol=1e-5)
    assert (
        int(np.argmax(answer["predictions"][0])) == 2
    )  # a heavy Biscoe male with a long bill: Gentoo


@pytest.mark.slow
def test_a_numeric_target_trains_and_reports_rmse(tmp_path: Path) -> None:
    """Proves: a numeric target trains and reports RMSE; and (issue 41, items 1 and 4) garbage
    rows among the real ones, trained with a clean schema, are shown as they happen (the
    status lines' count and reason, the last line), counted in the report, which names no
    built-in dataset; the status lines show the prequential RMSE, not an accuracy of nan."""
    from pipeline.table import infer
    from producers.datasets.table import held_out, sample_columns

    (tmp_path / "mass.json").write_text(
        infer(sample_columns(PENGUINS), label="body_mass_g").to_json()
    )
    lines = PENGUINS.read_text().splitlines()
    garbage = [
        i for i in range(len(lines) - 1) if i % 12 == 11
    ]  # 28 rows of words: 8%, under the default 10%
    for i in garbage:
        lines[i + 1] = ",".join(["abc"] * len(lines[0].split(",")))
    (tmp_path / "dirty.csv").write_text("\n".join(lines) + "\n")
    epochs = 20
    done = _cli(
        "run",
        "--data",
        str(tmp_path / "dirty.csv"),
        "--schema",
        str(tmp_path / "mass.json"),
        "--epochs",
        str(epochs),
        "--out",
        str(tmp_path / "mass"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "mass/report.json").read_text())
    assert report["algorithm"]["config"]["loss"] == "mean_squared_error"
    assert set(report["final"]) == {"rmse", "mae"}
    assert report["final"]["rmse"] < 800  # grams; the masses' own deviation is ~800
    assert "held-out rmse" in done.stdout
    status = [line for line in done.stdout.splitlines() if line.startswith("batch")]
    assert status and all("prequential acc" not in line for line in status), status[:3]
    assert any("prequential rmse" in line for line in status), status[:3]
    trained_garbage = sum(not h for h in held_out(np.array(garbage, np.uint64), 0.1))
    by_reason = report["rejected"][
        "by_reason"
    ]  # the file's own two rows without a mass, and the words
    assert by_reason == {
        "not_a_number:bill_length_mm": epochs * trained_garbage,
        "missing:body_mass_g": epochs * 2,
    }
    assert report["rejected_records"] == sum(by_reason.values()), report["rejected"]
    assert any(
        "rejected " in line and "%: not_a_number:bill_length_mm" in line for line in status
    ), status[-3:]
    assert f"rejected {report['rejected_records']:,} (not_a_number:" in done.stdout.splitlines()[-2]
    assert report["settings"]["dataset"] is None and report["settings"]["data"].endswith(
        "dirty.csv"
    )


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    """Write records as a Kafka user would: confluent-kafka (librdkafka), keyed, compressed."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4", "linger.ms": 5})
    for i, value in enumerate(values):
        producer.produce(
            topic, value=value, key=f"penguin-{i % 344}".encode()
        )  # a penguin's key, every time
    assert producer.flush(30) == 0


@pytest.mark.slow
def test_topics_of_json_and_avro_records_written_by_confluent_kafka(
    broker, topic, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """Proves: a topic fed by someone else trains by a schema (inferred from its first JSON
    records, or given with the Avro writer's schema); the held-out share of keys scores
    the model and is never trained; a bad record goes to dead letters naming its field.

    Slow: three runs of `streamtrain run`, each starting Spark, the parameter server and
    TensorFlow workers: a batch of the JSON topic, a batch of the Avro topic, and the run on
    Confluent-framed records that stops in one line once its rejections pass the bound; each
    topic's format needs a run of its own."""
    rows = [r for _, block, _ in read_rows(PENGUINS) for r in block]
    from pipeline.table import infer
    from producers.datasets.table import sample_columns

    table = infer(sample_columns(PENGUINS), label="species")
    # A word where a number goes.
    bad = b'{"island": "Dream", "bill_length_mm": "long", "species": "Adelie"}'
    copies = (
        8  # the same 344 penguins 8 times over, same keys: one pass of a topic is enough to learn
    )
    _produce(broker.bootstrap, topic, encode_values(rows, table) * copies + [bad])
    done = _cli(
        "run",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
        "--format",
        "json",
        "--label",
        "species",
        "--holdout",
        "0.2",
        "--max-batches",
        "1",
        "--out",
        str(tmp_path / "json"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "json/report.json").read_text())
    held = re.search(r"held-out scores on (\d+) records", done.stderr)
    assert (
        held and int(held.group(1)) % copies == 0 and 40 <= int(held.group(1)) // copies <= 100
    ), done.stderr[-2000:]
    assert (
        report["trained_records"] == copies * 344 - int(held.group(1))
        and report["rejected_records"] == 1
    )
    assert report["batches"][0]["rejected"] == {"not_a_number:bill_length_mm": 1}
    assert report["final"]["accuracy"] > 0.85 and "auc" not in report["final"]
    avro = table.with_format("avro")
    (tmp_path / "avro.json").write_text(avro.to_json())
    _produce(broker.bootstrap, topic + "-avro", encode_values(rows, avro))
    done = _cli(
        "run",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic + "-avro",
        "--schema",
        str(tmp_path / "avro.json"),
        "--max-batches",
        "1",
        "--out",
        str(tmp_path / "avro"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "avro/report.json").read_text())
    assert (
        report["trained_records"] + report["rejected_records"] < 344
        and report["rejected_records"] == 0
    )
    # Issue 41, item 2: Confluent-framed records read by a schema file that says nothing of the
    # framing: every record rejected, so the run stops in one line naming the fix, having
    # printed no "first micro-batch trained" and no score (it was a zero-size traceback).
    _produce(broker.bootstrap, topic + "-framed", encode_values(rows, avro, schema_id=5) * 4)
    eval_rows = tmp_path / "eval.csv"
    eval_rows.write_text("\n".join(PENGUINS.read_text().splitlines()[::4]) + "\n")
    done = _cli(
        "run",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic + "-framed",
        "--schema",
        str(tmp_path / "avro.json"),
        "--eval-data",
        str(eval_rows),
        "--max-batches",
        "3",
        "--out",
        str(tmp_path / "framed"),
    )
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert (
        last.startswith("streamtrain: error: Expected at most 10% of the records rejected")
        and 'Hint: the records carry the Confluent wire format: add "wire": "confluent"' in last
    ), last
    assert "Traceback" not in done.stderr and "first micro-batch trained" not in done.stdout
    assert "held-out" not in done.stdout.replace("held-out set", ""), done.stdout[-2000:]


@pytest.mark.slow  # starts a run that must stop as soon as the model is described
def test_a_model_that_does_not_fit_the_table_is_refused_in_one_line(tmp_path: Path) -> None:
    done = _cli(
        "run",
        "--data",
        str(PENGUINS),
        "--label",
        "species",
        "--model",
        f"{MODELS}:wrong_outputs",
        "--out",
        str(tmp_path / "bad"),
    )
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "streamtrain: error: Expected a model with input [12] and 3 output unit(s) for penguins's "
        "3 classes (12 encoded columns). Received: input [12] and 5 output unit(s). Change the "
        "model's Input or its last layer."
    ), last
    assert "Traceback" not in done.stderr and not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_the_users_compile_is_kept(tmp_path: Path) -> None:
    """A model compiled with SGD at learning rate 0 trains with exactly that: the start-up
    says so, the report records it, and the weights do not move."""
    done = _cli(
        "run",
        "--data",
        str(PENGUINS),
        "--label",
        "species",
        "--model",
        f"{MODELS}:compiled_frozen",
        "--epochs",
        "3",
        "--out",
        str(tmp_path / "frozen"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "training with the model's own compile: optimizer SGD, loss sparse_categorical_crossentropy"
        in done.stdout
    )
    report = json.loads((tmp_path / "frozen/report.json").read_text())
    optimizer = report["algorithm"]["config"]["worker_optimizer"]
    assert optimizer["class_name"] == "SGD" and optimizer["config"]["learning_rate"] == 0.0
    accuracies = {b["heldout"]["accuracy"] for b in report["batches"] if b.get("heldout")} | {
        report["final"]["accuracy"]
    }
    assert len(accuracies) == 1, accuracies


def test_a_table_on_the_default_model_trains_in_small_batches_at_a_higher_rate() -> None:
    """Proves: a table on the default MLP gets its own batch size and Adam rate (steps, not
    throughput, are what its cheap records lack); a built-in dataset, a user's model and a
    batch size given keep theirs."""
    from pipeline.jobs.run_config import TABLE_BATCH_SIZE, TABLE_LEARNING_RATE, RunConfig
    from pipeline.jobs.run_training import algorithm_of

    table = RunConfig(data=str(PENGUINS), label="species")
    assert table.batch_size == TABLE_BATCH_SIZE == 16
    optimizer = algorithm_of(table).worker_optimizer
    assert optimizer == {"class_name": "Adam", "config": {"learning_rate": TABLE_LEARNING_RATE}}
    assert RunConfig(topic="t", format="json", label="y").batch_size == 16
    for cfg in (
        RunConfig(),
        RunConfig(data=str(PENGUINS), label="species", model=f"{MODELS}:compiled_frozen"),
    ):
        assert cfg.batch_size == 128 and algorithm_of(cfg).worker_optimizer == "adam"
    assert RunConfig(data=str(PENGUINS), label="species", batch_size=64).batch_size == 64


@pytest.mark.parametrize("option", [{"epochs": 8}, {"rate": 500.0}])
def test_replay_options_on_a_topic_someone_else_feeds_are_refused(option: dict[str, float]) -> None:
    """Proves: --epochs and --rate, which set a replay, are refused in one line on a topic
    nothing replays into (they were silently ignored)."""
    from pipeline.errors import ConfigError
    from pipeline.jobs.run_config import RunConfig

    cfg = RunConfig(topic="orders", bootstrap="127.0.0.1:1", format="json", label="y", **option)
    with pytest.raises(ConfigError, match=r"Received: --(epochs 8|rate 500) with --topic orders"):
        cfg.validate()
    RunConfig(data=str(PENGUINS), label="species", **option).validate()


def test_a_table_run_resumed_keeps_the_optimizer_it_started_with(tmp_path: Path) -> None:
    """Proves: a default-model table run recorded with Keras's default Adam (before the
    table default's rate) resumes with it, so its model's fingerprint still matches."""
    import dataclasses

    from pipeline.jobs import run_record
    from pipeline.jobs.online import Run
    from pipeline.jobs.run_config import RunConfig

    cfg = RunConfig(data=str(PENGUINS), label="species", out=str(tmp_path))
    run_record.write(tmp_path, dataclasses.asdict(cfg))
    path = tmp_path / run_record.RECORD_FILE
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "spec": {"optimizer": "adam"}}))
    resumed = Run(dataclasses.replace(cfg, resume=True))
    assert resumed.algorithm.worker_optimizer == "adam"
    assert isinstance(Run(cfg).algorithm.worker_optimizer, dict)  # a new run: the table default
