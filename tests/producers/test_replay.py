"""The replay producer against the real embedded broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from pipeline import codec, record_key
from pipeline.errors import BrokerError, ConfigError
from pipeline.ingest.kafka import EmbeddedBroker, client
from pipeline.observe import exposition, metrics
from producers import Replay, datasets


def _round_trip(
    data: datasets.Dataset,
    broker: EmbeddedBroker,
    topic: str,
    consume: Callable[..., list],
    split: str = "train",
    limit: int | None = None,
) -> None:
    report = Replay(
        data, bootstrap=broker.bootstrap, topic=topic, split=split, limit=limit, partitions=3
    ).run()
    expected = data.load(split)
    n = len(expected.y) if limit is None else limit
    assert report.records_sent == n and report.send_errors == 0
    assert report.bytes_sent == (
        n * data.schema.record_bytes
        if data.schema.table is None
        else sum(len(v) for c in data.iter_chunks(split) for v in c.values or [])
    )
    records = consume(topic, n)
    assert len(records) == n
    ids = record_key.decode_keys([r.key for r in records])
    # Keyed by record id, partition = id mod partitions, in id order within a partition.
    assert all(r.partition == int(i) % 3 for r, i in zip(records, ids, strict=True))
    order = np.argsort(ids, kind="stable")
    assert ids[order].tolist() == expected.ids[:n].tolist()
    values = [records[i].value for i in order]
    # Byte-exact against an independent encoding of the reader's rows (a table's rows go as
    # the file has them, in its format) ...
    if data.schema.table is None:
        assert values == codec.encode(expected.x[:n], expected.y[:n], data.schema)
    # ... and the decoder gives back exactly the reader's arrays.
    out = codec.decode(values, data.schema)
    assert out.rejected.size == 0
    assert np.array_equal(out.x, expected.x[:n]) and np.array_equal(out.y, expected.y[:n])
    # Event time is the Kafka timestamp, set at send.
    now_ms = time.time() * 1000
    assert all(now_ms - 600_000 < r.timestamp <= now_ms + 1000 for r in records[:10])


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_mnist_train_split_round_trips_exactly(broker, topic, consume, mnist) -> None:  # type: ignore[no-untyped-def]
    _round_trip(mnist, broker, topic, consume)


def test_fashion_mnist_test_split_round_trips_exactly(broker, topic, consume) -> None:  # type: ignore[no-untyped-def]
    _round_trip(datasets.get("fashion-mnist"), broker, topic, consume, split="test", limit=5000)


def test_higgs_sample_round_trips_exactly(broker, topic, consume, data_dir) -> None:  # type: ignore[no-untyped-def]
    _round_trip(datasets.get("higgs", data_dir=data_dir), broker, topic, consume)
    _round_trip(
        datasets.get("higgs", data_dir=data_dir), broker, topic + "-test", consume, split="test"
    )


def test_csv_and_npz_round_trip_exactly(broker, topic, consume, tmp_path, data_dir) -> None:  # type: ignore[no-untyped-def]
    sample = datasets.get("higgs", data_dir=data_dir).load("test")
    csv = tmp_path / "d.csv"
    header = "f0,label," + ",".join(f"f{i}" for i in range(1, 28))
    rows = [
        ",".join([f"{r[0]:.3f}", str(y), *(f"{v:.3f}" for v in r[1:])])
        for r, y in zip(sample.x, sample.y, strict=True)
    ]
    csv.write_text(header + "\n" + "\n".join(rows) + "\n")
    _round_trip(datasets.get("csv", csv, label="label"), broker, topic, consume)
    np.savez(tmp_path / "d.npz", x_train=sample.x, y_train=sample.y)
    _round_trip(datasets.get("npz", tmp_path / "d.npz"), broker, topic + "-npz", consume)


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_rate_limit_holds_within_ten_percent(broker, topic, data_dir) -> None:  # type: ignore[no-untyped-def]
    rate, limit = 2000, 6000
    started = time.monotonic()
    report = Replay(
        datasets.get("higgs", data_dir=data_dir),
        bootstrap=broker.bootstrap,
        topic=topic,
        rate=rate,
        limit=limit,
    ).run()
    elapsed = time.monotonic() - started
    assert report.records_sent == limit
    achieved = limit / elapsed
    assert 0.9 * rate <= achieved <= 1.1 * rate, f"{achieved:.0f} records/s for a limit of {rate}"


def test_loop_replays_epochs_with_the_same_ids(broker, topic, consume, data_dir) -> None:  # type: ignore[no-untyped-def]
    data = datasets.get("higgs", data_dir=data_dir)
    report = Replay(
        data, bootstrap=broker.bootstrap, topic=topic, split="test", loop=True, limit=1200
    ).run()
    assert report.records_sent == 1200 and report.epochs == 2
    ids = record_key.decode_keys([r.key for r in consume(topic, 1200)])
    assert np.bincount(ids.astype(np.int64)).tolist() == [3] * 200 + [2] * 300


def test_malformed_rows_are_counted_skipped_and_exported(broker, topic, consume, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "d.csv"
    path.write_text("x,label\n1,0\noops,1\n2,1\n3\n4,9\n5,0\n")
    schema = tmp_path / "s.json"
    schema.write_text(
        '{"features": [{"name": "x"}], "label": {"name": "label", "classes": [0, 1]}}'
    )
    meters = metrics.producer_metrics()
    server = exposition.serve(meters.registry, port=0)
    try:
        report = Replay(
            datasets.get("csv", path, schema=schema, holdout=0.0),
            bootstrap=broker.bootstrap,
            topic=topic,
            meters=meters,
        ).run()
        body = urllib.request.urlopen(server.url, timeout=5).read().decode()
    finally:
        server.stop()
    assert report.records_sent == 3 and report.malformed == 3
    # Which rows and why, in the summary and in the metrics by reason.
    assert report.malformed_examples == [
        (3, "not_a_number:x"),
        (5, "wrong_field_count:1"),
        (6, "unknown_class:label"),
    ]
    assert (
        "(line 3: not_a_number:x, line 5: wrong_field_count:1, line 6: unknown_class:label)"
        in report.summary()
    )
    for reason, n in (
        ("not_a_number:x", 1),
        ("wrong_field_count:1", 1),
        ("unknown_class:label", 1),
    ):
        assert (
            f'streamtrain_producer_malformed_rows_total{{dataset="d",reason="{reason}"}} {n:.1f}'
            in body
        )
    assert f'streamtrain_producer_records_sent_total{{dataset="d",topic="{topic}"}} 3.0' in body
    values = [r.value for r in consume(topic, 3)]
    assert sorted(values) == [
        b'{"x":1.0,"label":"0"}',
        b'{"x":2.0,"label":"1"}',
        b'{"x":5.0,"label":"0"}',
    ]
    decoded = codec.decode(values, datasets.get("csv", path, schema=schema).schema)
    assert sorted(decoded.x.ravel().tolist()) == [1, 2, 5]


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_no_broker_is_a_clear_error() -> None:
    data = datasets.get("higgs")
    with pytest.raises(BrokerError, match="Cannot reach Kafka at 127.0.0.1:1"):
        Replay(data, bootstrap="127.0.0.1:1", topic="t").run()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rate": 0}, "--rate > 0"),
        ({"limit": -1}, "--limit >= 0"),
        ({"bootstrap": "nohost"}, "HOST:PORT"),
    ],
)
def test_bad_options_are_refused(kwargs: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigError, match=match):
        Replay(datasets.get("higgs"), **{"bootstrap": "127.0.0.1:9", "topic": "t", **kwargs})


def _cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_ctrl_c_flushes_and_reports(broker, topic, consume, sig: int, status: int) -> None:  # type: ignore[no-untyped-def]
    """Proves: a Ctrl-C or a SIGTERM stops a looping producer after a flush, with its report;
    a SIGTERM (docker compose stop) is a requested stop, exit 0, where a Ctrl-C keeps 130."""
    client.ensure_topic(broker.bootstrap, topic, partitions=2)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "produce",
            "higgs",
            "--topic",
            topic,
            "--rate",
            "500",
            "--loop",
            "--bootstrap",
            broker.bootstrap,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert consume(topic, 1, timeout_s=60), (
            "no record arrived"
        )  # interrupted mid-send, once they flow
    finally:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == status, err
    assert "(interrupted)" in out and "Traceback" not in err
    sent = int(out.split("sent ")[1].split(" records")[0])
    assert sent > 0
    # Everything reported as sent is in the topic: the flush happened before the report.
    assert len(consume(topic, sent, timeout_s=10)) == sent


@pytest.mark.parametrize("delay_s", [0.1, 0.3, 0.6, 0.9, 1.2, 1.8])
def test_ctrl_c_at_any_moment_of_start_up_stops_promptly(broker, topic, delay_s) -> None:  # type: ignore[no-untyped-def]
    """Proves: a Ctrl-C during start-up (imports, data, topic, producer) is never lost. It
    used to be, when it landed inside kafka-python's event loop, which drops exceptions
    raised in its tasks, and a --loop producer ran on. Now: exit 130 within seconds, with
    the report once the command has started, and never a traceback."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "produce",
            "higgs",
            "--topic",
            topic,
            "--rate",
            "500",
            "--loop",
            "--bootstrap",
            broker.bootstrap,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(delay_s)  # the moment of the Ctrl-C, not a wait for a condition
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode == -signal.SIGINT and "init_import_site" in err:
        return  # it landed in CPython's own start-up, before any code of ours: stopped, promptly
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert "interrupted" in out + err, (out, err[-500:])


def _ids_in(consume, topic: str, expect: int) -> list[int]:  # type: ignore[no-untyped-def]
    # One more than expected: a duplicate would show (consume waits its deadline out).
    records = consume(topic, expect + 1, timeout_s=5)
    return sorted(record_key.decode_keys([r.key for r in records]).tolist())


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_resume_sends_only_what_the_topic_lacks(broker, topic, consume, data_dir) -> None:  # type: ignore[no-untyped-def]
    """Proves: a replay resumed after an earlier one stopped part way sends the rest of its
    order and nothing twice: the topic ends with each record once."""
    higgs = datasets.get("higgs", data_dir=data_dir)
    first = Replay(higgs, bootstrap=broker.bootstrap, topic=topic, partitions=3, limit=600).run()
    again = Replay(
        higgs, bootstrap=broker.bootstrap, topic=topic, partitions=3, limit=1000, resume=True
    ).run()
    assert (first.records_sent, again.resumed_after, again.records_sent) == (600, 600, 400)
    assert _ids_in(consume, topic, 1000) == list(range(1000))


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_a_killed_producer_resumed_loses_and_duplicates_nothing(broker, topic, consume) -> None:  # type: ignore[no-untyped-def]
    """Proves: SIGKILL in the middle of sending (records in flight, nothing flushed or
    reported), then `produce --resume`: every record of the replay is in the topic once."""
    base = [
        sys.executable,
        "-m",
        "pipeline",
        "produce",
        "higgs",
        "--topic",
        topic,
        "--limit",
        "3000",
        "--bootstrap",
        broker.bootstrap,
        "--partitions",
        "2",
    ]
    client.ensure_topic(broker.bootstrap, topic, partitions=2)
    proc = subprocess.Popen(
        [*base, "--rate", "1500"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        assert len(consume(topic, 500, timeout_s=60)) >= 500, "the first replay sent nothing"
    finally:
        proc.kill()
        proc.wait()
    done = subprocess.run([*base, "--resume"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "resumed after the" in done.stdout
    assert _ids_in(consume, topic, 3000) == list(range(3000))


@pytest.mark.slow  # 3 to 8 s (a process to start or a timeout to wait out): full tier only
def test_max_malformed_fails_a_mostly_bad_file(broker, topic, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Proves: a file that is mostly malformed fails the replay with one line naming the rows,
    by count and by fraction; under the limit it passes and says which rows it skipped."""
    path = tmp_path / "d.csv"
    path.write_text(
        "x,label\n" + "".join(f"{i},0\n" if i % 4 == 0 else f"{i},x\n" for i in range(40))
    )
    env = {**os.environ, "STREAMTRAIN_CACHE_DIR": str(tmp_path)}
    schema = tmp_path / "s.json"
    schema.write_text(
        '{"features": [{"name": "x"}], "label": {"name": "label", "classes": [0, 1]}}'
    )
    base = [
        "produce",
        "csv",
        str(path),
        "--schema",
        str(schema),
        "--bootstrap",
        broker.bootstrap,
        "--topic",
        topic,
    ]
    for limit in ("5", "0.5"):
        done = _cli(*base, "--max-malformed", limit, env=env)
        assert done.returncode == 2, done.stderr[-2000:]
        [error] = [
            line for line in done.stderr.splitlines() if line.startswith("streamtrain: error:")
        ]
        assert "--max-malformed" in error and "line 3: unknown_class:label" in error, error
    done = _cli(*base, env=env)  # a table's default: fail once most rows are bad
    assert done.returncode == 2 and "at most 50% of the rows" in done.stderr, done.stderr[-2000:]
    done = _cli(*base, "--max-malformed", "30", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (
        "30 malformed rows skipped (line 3: unknown_class:label, line 4: unknown_class:label"
        in done.stdout
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["produce", "csv", "/no/such.csv", "--label", "y", "--bootstrap", "127.0.0.1:9"],
            "Expected a data file at /no/such.csv",
        ),
        pytest.param(  # retried for 5 s, as a broker that is starting would be
            ["produce", "higgs", "--bootstrap", "127.0.0.1:1"],
            "Cannot reach Kafka at 127.0.0.1:1",
            marks=pytest.mark.slow,
        ),
        (["produce", "higgs", "--rate", "-5", "--bootstrap", "127.0.0.1:9"], "Expected --rate > 0"),
        (
            ["produce", "mnist", "--label-column", "y", "--bootstrap", "127.0.0.1:9"],
            "--label does not apply",
        ),
    ],
)
def test_cli_errors_are_one_line_without_traceback(
    args: list[str], message: str, tmp_path: Path
) -> None:
    done = _cli(*args, env={**os.environ, "STREAMTRAIN_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in done.stderr


@pytest.mark.slow  # waits out the final flush
def test_a_stop_while_kafka_is_away_reports_within_the_final_flush(
    topic, data_dir, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """Proves: a replay stopped while its broker is gone still stops within FINAL_FLUSH_S
    and reports; what Kafka never acknowledged counts as send errors, none as sent."""
    import threading

    from producers import replay as replay_mod

    monkeypatch.setattr(replay_mod, "FINAL_FLUSH_S", 2.0)
    before = set(threading.enumerate())
    gone = EmbeddedBroker().start()
    stop = threading.Event()
    r = Replay(
        datasets.get("higgs", data_dir=data_dir),
        bootstrap=gone.bootstrap,
        topic=topic,
        rate=500,
        stop=stop,
    )
    done: list[replay_mod.ReplayReport] = []
    sender = threading.Thread(target=lambda: done.append(r.run()), daemon=True)
    sender.start()
    deadline = time.monotonic() + 30
    while r.metrics.records_sent.labels(topic, "higgs")._value.get() < 200:
        assert time.monotonic() < deadline and sender.is_alive(), "the replay never got going"
        time.sleep(0.05)
    gone.stop()
    time.sleep(0.5)  # sends now go nowhere: the outage is the fault
    stop.set()
    stopped_at = time.monotonic()
    sender.join(30)
    assert (
        not sender.is_alive() and time.monotonic() - stopped_at < 20
    )  # 2 s of flush, then closing
    report = done[0]
    assert report.interrupted and report.records_sent >= 200 and report.send_errors > 0
    # Its network thread ended too: kafka-python's close leaves it running when its flush times out.
    left = set(threading.enumerate()) - before
    assert not [t.name for t in left if t.name.endswith("-network-thread")]
