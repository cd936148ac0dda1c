"""A table with ID features, end to end (issue 56): a click stream trained through the row
servers, exactly once through a driver killed at three batch boundaries, on one shard or two
alike, its default model well above the majority class, and served with a known and an
unknown ID."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from pipeline.ingest.kafka.broker import free_port
from pipeline.train import checkpoint, table_store
from pipeline.train.row_servers import RowServers, specs_of
from producers import Replay
from producers.datasets.click_stream import ClickStream, click_schema
from producers.datasets.clicks import ClickModel

ROOT = Path(__file__).resolve().parents[2]
#: Small ID spaces, so that a short run sees each ID often enough to learn it.
MODEL = ClickModel(users=1_500, items=600, seed=5)
RECORDS, PER_BATCH = 12_000, 2_000


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def _tables(folder: Path, schema: object) -> tuple[RowServers, checkpoint.State]:
    state = checkpoint.load(folder)
    assert state is not None
    rows = RowServers(specs_of(schema, 1), secret=b"x", host="127.0.0.1")  # never started
    assert table_store.restore(folder, rows, state.extra["tables"]) >= 1
    return rows, state


@pytest.mark.slow
def test_a_click_stream_trains_its_id_tables_exactly_once_and_serves_them(
    broker,
    topic,
    tmp_path,  # type: ignore[no-untyped-def]
) -> None:
    """Proves: a click stream's ID tables train exactly once: on one shard, through a driver
    killed at three batch boundaries, they end with the tables and weights of an uninterrupted
    run on two shards; rows expire by their TTL, the model beats the majority class, and `serve`
    answers a known and an unknown ID.

    Slow: five runs of `streamtrain run`, each starting Spark, the parameter server, the row
    servers and a TensorFlow worker (the uninterrupted run of six 2,000-record batches, three
    runs killed at a boundary each, and the resume that finishes), then `streamtrain serve`; the
    exact comparison needs the uninterrupted run beside the killed chain."""
    Replay(
        ClickStream(model=MODEL),
        bootstrap=broker.bootstrap,
        topic=topic,
        partitions=1,
        limit=RECORDS,
    ).run()
    table = click_schema(MODEL, dim=8, ttl=4_000)  # rows expire within the run
    (tmp_path / "clicks.schema.json").write_text(table.to_json())
    common = [
        "run",
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
        "--schema",
        str(tmp_path / "clicks.schema.json"),
        "--max-offsets-per-trigger",
        str(PER_BATCH),
        "--seed",
        "1",
        # One worker: two would push rows concurrently, and the order of Adagrad's steps on a
        # row shared by both would be a race; one makes the comparison exact.
        "--workers",
        "1",
    ]
    batches = RECORDS // PER_BATCH
    whole = _cli(
        *common, "--ps-shards", "2", "--max-batches", str(batches), "--out", str(tmp_path / "whole")
    )
    assert whole.returncode == 0, whole.stderr[-3000:]

    # One shard, the driver killed inside batch 1, after batch 2's save, after batch 3's commit.
    folder = ["--out", str(tmp_path / "killed")]
    for fault in ("batch:1", "saved:2", "committed:3"):
        killed = _cli(*common, *folder, env={"STREAMTRAIN_FAULT": fault})
        assert killed.returncode == -signal.SIGKILL, (fault, killed.stderr[-3000:])
        folder = ["--resume", str(tmp_path / "killed")]
    done = _cli(*common, *folder, "--max-batches", str(batches - 4))
    assert done.returncode == 0, done.stderr[-3000:]

    a, a_state = _tables(tmp_path / "whole", table)
    b, b_state = _tables(tmp_path / "killed", table)
    assert a_state.last_batch_id == b_state.last_batch_id == batches - 1
    assert a_state.extra["trained"] == b_state.extra["trained"] > 0.8 * RECORDS
    for t, spec in enumerate(a.specs):
        mine, theirs = a.table_rows(t), b.table_rows(t)
        assert len(mine["keys"]) > 100, spec.name
        assert np.array_equal(mine["keys"], theirs["keys"]), spec.name
        assert np.array_equal(mine["last_seen"], theirs["last_seen"]), spec.name
        for field in ("values", "accum"):
            assert np.allclose(mine[field], theirs[field], rtol=0, atol=1e-5), (spec.name, field)
    assert np.allclose(a_state.weights, b_state.weights, rtol=0, atol=1e-5)
    report = json.loads((tmp_path / "whole" / "report.json").read_text())
    sizes = [b["tables"]["sizes"] for b in report["batches"] if "tables" in b]
    assert len(sizes) == batches and sizes[-1]["user_id"]["expired"] > 0  # ttl at work
    # The default model, well above the majority class's AUC of 0.5.
    assert report["final"]["auc"] > 0.62, report["final"]

    port = free_port()
    serving = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "serve", str(tmp_path / "whole"), "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert serving.stderr is not None
        said = ""
        while "serving " not in said:  # the first line names the model and the URL
            line = serving.stderr.readline()
            assert line, f"serve exited: {said}"
            said += line
        url = said.split(" at ", 1)[1].split(";", 1)[0]
        name = said.split("serving ", 1)[1].split(" ", 1)[0]
        seen = MODEL.record(MODEL.sample(RECORDS - 1, 1), 0)
        unseen = {**seen, "user_id": "u-never-seen"}
        del seen["clicked"], unseen["clicked"]
        body = json.dumps({"instances": [seen, unseen]}).encode()
        request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            predictions = json.loads(r.read())["predictions"]
        assert len(predictions) == 2 and predictions[0] != predictions[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert f'streamtrain_serve_unknown_ids_total{{model="{name}"}} 1.0' in metrics
    finally:
        serving.send_signal(signal.SIGTERM)
        serving.wait(timeout=30)
