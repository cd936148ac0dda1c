"""Freshness benchmark: how old the newest data is that the model has learned, with fixed
20,000-record batches and with ``--freshness-target``, at loads sized from the capacity the run
measures (so that every target means the same on a slow machine and a fast one); what a
micro-batch costs beyond its records' compute; and what the target costs in capacity.

Per arm, one trainer (``streamtrain run --dataset mnist --bootstrap B --topic T``, no replay of
its own) on a fresh two-partition topic of Apache Kafka's own broker, started here (``--engine
tansu``: its Fetch slows as its log grows, to 6-37 s a batch's read at 2,558 records/s):

1. capacity: a backlog of 60,000 records is written flat out before the trainer starts; its
   records/s over the batches that drain it (the first left out: it pays the workers' start)
   is the arm's maximum sustained rate; measured again at the end on a backlog of its own, in
   the other order (fixed, target, target, fixed), and the two averaged (``capacity_ratio``);
2. ``C``, which sizes both arms' loads: the fixed arm drains a second backlog of 60,000 while
   the producer sends at ``--load`` x its first figure, and ``C`` is its rate over the
   batches planned at the cap. The producer and the broker share these cores with the
   trainer: measured here, they took a fifth of a core through the burst and its drain, and
   the workers 145% of the two cores where they had 165% on a backlog alone (sized from
   ``C`` taken alone, the phases asked for a spare rate the trainer never had);
3. a producer in this process (librdkafka) at ``--load`` x C (0.5) for 180 s, then
   ``--burst`` x C (2) for 30 s, then the load again for 240 s, phases back to back (each
   record's CreateTime is when it was sent);
4. the trainer drains the topic and is stopped (SIGINT), its report written.

Freshness at time t: t minus the newest Kafka timestamp the saved model holds (each batch's
``data_as_of`` in ``batches.jsonl``, from when its tasks were done, ``at``), every 0.1 s. The
steady figures are over the first phase from 30 s in (the backlog drained, settled) and the
last from 120 s after the burst. The burst leaves ``(burst - 1) x C x 30 s`` records above what
the trainer takes, drained at the spare rate ``(1 - load) x C``: 60 s whatever C is, the ideal
recovery. ``recovery_ratio`` is that over the seconds from the burst's end until freshness
is under the target for good within the 120 s after it (a moment over it later, such as a
checkpoint that a busy disk held for a second minutes on, is the last steady phase's, in its
p99; where it is still over at 120 s, until it stays under to the end; 1.0: perfect; 0:
never).

``batch_overhead_s``: the target arm's median, over its steady phases' batches, of a batch's
cycle (from the previous batch's end to its own) minus its records' compute (the workers'
compute seconds over the workers): the trigger, planning, task launch, reading, the
exchange, scoring, checkpoint and commit. Its parts' medians are printed before the last line.

    .venv/bin/python bench/freshness.py [--scale 1] [--target 2] [--load 0.5] [--burst 2]

At ``--scale 1`` each arm runs about 9 minutes (start-up, backlog, 450 s of phases, drain),
the fixed arm 2 more (its loaded backlog): 23 minutes in all. ``--scale`` multiplies every
duration (and, above 1, the backlog): ``--scale 0.1`` checks that it runs end to end in about
seven minutes (start-ups dominate; the figures mean little).

Last line: ``freshness p50_s=<s> p99_s=<s> recovery_ratio=<r> capacity_ratio=<r>
batch_overhead_s=<s> capacity_rps=<C>`` (p50, p99, the recovery and the overhead are the
target arm's; capacity_ratio: its capacity over the fixed arm's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from freshness_figures import (  # noqa: E402
    capacity,
    freshness_series,
    overhead,
    recovery_s,
    saturated_rate,
)
from soak import Proc  # noqa: E402

#: (phase, seconds at scale 1); the rates are ``--load`` x C, ``--burst`` x C, ``--load`` x C.
PHASES = (("steady", 180.0), ("burst", 30.0), ("after", 240.0))
BACKLOG = 60_000
#: The steady figures leave out the first phase's first SETTLE_S and the last one's first
#: RECOVERY_S (the ideal recovery is 60 s: twice that).
SETTLE_S, RECOVERY_S = 30.0, 120.0
#: Seconds at scale 1 that the producer sends at the load while C is measured under it.
LOADED_S = 90.0
#: Every arm's cap on a batch's records (--max-offsets-per-trigger).
CAP = 20_000


def _wait(cond: Any, timeout_s: float, what: str, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if proc is not None and proc.pid is None:
            # Its log lives in the run's temporary folder, removed on the way out: say its end here.
            tail = "\n".join(proc.text().splitlines()[-20:])
            raise SystemExit(
                f"freshness: the {proc.name} exited while waiting for {what}; its last "
                f"lines:\n{tail}"
            )
        if time.monotonic() > deadline:
            raise SystemExit(f"freshness: {what} not within {timeout_s:.0f} s")
        time.sleep(0.2)


def _rows(out: Path) -> list[dict[str, Any]]:
    path = out / "batches.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:  # a line being written
            continue
    return rows


def _backlog(scale: float) -> int:
    """Never below BACKLOG: the capacity needs three batches of 20,000 to drain it."""
    return int(BACKLOG * max(1.0, scale))


def _trained(out: Path) -> int:
    """Records through the trainer: trained, or held out to score the model (which a run
    starts after a drift alarm; those never count as trained)."""
    return sum(int(r.get("trained", 0)) + int(r.get("held_out", 0)) for r in _rows(out))


def _produce(
    bootstrap: str,
    topic: str,
    phases: list[tuple[str, float, float | None]],
    marks: list[tuple[str, float, int]],
) -> None:
    """Send each phase's records (``seconds x rate``; rate None: flat out); ``marks`` gets
    each phase's name, start (Unix seconds) and records, then ``("end", t, 0)``.

    With librdkafka (confluent-kafka, the producer users run, its 5 ms linger), MNIST's
    records encoded once: the benchmark is of the trainer, whose capacity is measured with no
    producer running, and on these 2 cores streamtrain's own replay (kafka-python) took 0.42
    of a core at 550 records/s, which the trainer then lacked."""
    from confluent_kafka import Producer

    from pipeline import codec, config, record_key
    from producers import datasets

    data = datasets.get("mnist", data_dir=config.data_dir())
    train = data.load("train")
    values = codec.encode(train.x, train.y, data.schema)
    keys = record_key.encode_keys(train.ids)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    failed: list[str] = []

    def delivered(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    at = 0
    for name, seconds, rate in phases:
        n = int(seconds * rate) if rate else int(seconds)
        started = time.time()
        marks.append((name, started, n))
        sent = 0
        while sent < n:
            due = n if rate is None else min(n, int((time.time() - started) * rate) + 1)
            while sent < due:
                try:
                    producer.produce(
                        topic, values[at % len(values)], keys[at % len(keys)], on_delivery=delivered
                    )
                except BufferError:  # its queue is full: let it send
                    producer.poll(0.05)
                    continue
                sent, at = sent + 1, at + 1
            producer.poll(0)
            if sent < n:
                time.sleep(0.002)
    if producer.flush(120) or failed:
        raise SystemExit(
            f"freshness: the producer did not deliver its records ({len(failed)} failed, e.g. "
            f"{failed[:1]}; or not within 120 s): the phases' figures would count records that "
            "never arrived"
        )
    marks.append(("end", time.time(), 0))


def _on_backlog(
    name: str, extra: list[str], *, bootstrap: str, folder: Path, scale: float, run_s: float
) -> tuple[Proc, Path, str, float]:
    """Write a backlog to a fresh topic, start a trainer on it and wait until it is trained:
    the trainer (still running), its folder, the topic and its capacity (records/s)."""
    from pipeline.ingest.kafka import client

    topic = f"freshness-{name}-{int(time.time())}"
    client.ensure_topic(bootstrap, topic, partitions=2)
    backlog = _backlog(scale)
    _produce(bootstrap, topic, [("backlog", backlog, None)], [])
    out = folder / name
    trainer = Proc(
        f"trainer-{name}",
        [
            "run",
            "--dataset",
            "mnist",
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--out",
            str(out),
            "--eval-every",
            "1000000",
            "--timeout",
            str(int(600 + 2 * run_s)),
            *extra,
        ],
        folder,
    )
    try:
        _wait(
            lambda: _trained(out) >= backlog,
            300 + 60 * scale,
            f"{name}: the backlog trained",
            trainer,
        )
    except BaseException:
        trainer.signal(signal.SIGINT, timeout_s=120)
        raise
    cap = capacity(_rows(out), backlog)
    print(f"freshness: {name}: backlog of {backlog:,} trained, {cap:,.0f} records/s", flush=True)
    return trainer, out, topic, cap


def _loaded_capacity(
    name: str, out: Path, bootstrap: str, topic: str, rate: float, scale: float, trainer: Proc
) -> float:
    """The trainer's rate under the stream's load: a second backlog drained while the
    producer sends at ``rate``, over the batches planned at the cap (then drained)."""
    marks: list[tuple[str, float, int]] = []
    before = _trained(out)
    _produce(
        bootstrap,
        topic,
        [("backlog", _backlog(scale), None), ("load", LOADED_S * scale, rate)],
        marks,
    )
    sent = before + sum(n for _, _, n in marks)
    _wait(lambda: _trained(out) >= sent, 120 + 300 * scale, f"{name}: the loaded backlog", trainer)
    c = saturated_rate([r for r in _rows(out) if r["at"] >= marks[0][1]], CAP)
    print(
        f"freshness: {name}: under a load of {rate:,.0f} records/s, {c:,.0f} records/s", flush=True
    )
    return c


def capacity_again(name: str, extra: list[str], **kw: Any) -> float:
    """An arm's capacity measured once more, on a backlog of its own (then stopped)."""
    trainer, _, _, cap = _on_backlog(name, extra, run_s=0.0, **kw)
    trainer.signal(signal.SIGINT, timeout_s=120)
    return cap


def run_arm(
    name: str,
    extra: list[str],
    *,
    bootstrap: str,
    folder: Path,
    scale: float,
    target: float,
    load: float,
    burst: float,
    capacity_rps: float | None = None,
) -> dict[str, Any]:
    """One arm: its backlog (its capacity), then the phases at ``load`` and ``burst`` times
    ``capacity_rps`` (None: this arm's own rate under the load, ``C``), then its figures."""
    phases_s = sum(s for _, s in PHASES) * scale
    trainer, out, topic, cap = _on_backlog(
        name,
        extra,
        bootstrap=bootstrap,
        folder=folder,
        scale=scale,
        run_s=phases_s + LOADED_S * scale,
    )
    c = capacity_rps
    try:
        if c is None and cap > 0:
            c = _loaded_capacity(name, out, bootstrap, topic, cap * load, scale, trainer)
        if c is None or not c > 0:
            raise SystemExit(f"freshness: {name}: no capacity measured on the backlog ({cap}, {c})")
    except BaseException:
        trainer.signal(signal.SIGINT, timeout_s=120)
        raise
    rates = {"steady": load * c, "burst": burst * c, "after": load * c}
    trained_before = _trained(out)
    marks: list[tuple[str, float, int]] = []
    try:
        phases = [(p, s * scale, rates[p]) for p, s in PHASES]
        producer = threading.Thread(
            target=_produce, args=(bootstrap, topic, phases, marks), daemon=True
        )
        producer.start()
        producer.join(phases_s * 3 + 120)
        sent = trained_before + sum(n for _, _, n in marks)
        _wait(
            lambda: _trained(out) >= sent,
            120 + 600 * scale,
            f"{name}: all {sent:,} records trained",
            trainer,
        )
    finally:
        trainer.signal(signal.SIGINT, timeout_s=120)
    rows = _rows(out)
    times = {p: t for p, t, _ in marks}
    for (p, t, n), (_, t_next, _) in zip(marks, marks[1:], strict=False):
        print(
            f"freshness: {name}: {p} {n:,} records in {t_next - t:.1f} s "
            f"({n / max(t_next - t, 1e-9):,.0f}/s)",
            flush=True,
        )
    windows = [
        (times["steady"] + SETTLE_S * scale, times["burst"]),
        (times["after"] + RECOVERY_S * scale, times["end"]),
    ]
    steady = np.concatenate([freshness_series(rows, a, b) for a, b in windows])
    after = freshness_series(rows, times["after"], times["end"])
    recovery = recovery_s(after, target, RECOVERY_S * scale)
    # What the burst left above the trainer's rate, over the spare rate: 60 s at 2 C and 0.5 C.
    ideal = (burst - 1.0) * PHASES[1][1] * scale / (1.0 - load)
    finite = steady[np.isfinite(steady)]
    in_steady = [int(r.get("rows", 0)) for r in rows if any(a <= r["at"] < b for a, b in windows)]
    # Where the time went (the trigger, the checkpoint, the commit among it), from the run's report.
    try:
        shares = json.loads((out / "report.json").read_text()).get("time_shares", {})
    except (OSError, ValueError):
        shares = {}
    return {
        "capacity": cap,
        "sized_by": c,
        "rates": {k: round(v) for k, v in rates.items()},
        "recovery_s": recovery,
        "recovery_ratio": min(1.0, ideal / recovery) if recovery > 0 else 1.0,
        "p50": float(np.percentile(finite, 50)) if len(finite) else np.nan,
        "p99": float(np.percentile(finite, 99)) if len(finite) else np.nan,
        "steady_rows_p50": float(np.median(in_steady)) if in_steady else np.nan,
        "max_rows": max((int(r.get("rows", 0)) for r in rows), default=0),
        "overhead": overhead(rows, windows),
        "time_shares": shares,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--scale", type=float, default=1.0, help="Multiplies every duration and the backlog."
    )
    parser.add_argument(
        "--target", type=float, default=2.0, help="The target arm's --freshness-target, seconds."
    )
    parser.add_argument(
        "--load", type=float, default=0.5, help="The steady phases' rate, a share of C."
    )
    parser.add_argument(
        "--burst", type=float, default=2.0, help="The burst's rate for 30 s, a multiple of C."
    )
    parser.add_argument(
        "--engine",
        choices=("kafka", "tansu", "noida"),
        default="kafka",
        help="The broker started here (kafka: Apache Kafka's own).",
    )
    parser.add_argument(
        "--keep",
        type=Path,
        help="A folder to keep each arm's run in (batches.jsonl, report.json); default: removed.",
    )
    args = parser.parse_args()
    if not (args.scale > 0 and args.target > 0 and 0 < args.load < 1 < args.burst):
        raise SystemExit(
            f"freshness: expected --scale and --target > 0, 0 < --load < 1 < --burst. Received: "
            f"{args.scale}, {args.target}, {args.load} and {args.burst}. Pass numbers in those "
            "ranges (the defaults are the issue's)."
        )
    from pipeline.ingest.kafka.broker import free_port

    with contextlib.ExitStack() as stack:
        if args.keep is None:
            folder = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="streamtrain-freshness-"))
            )
        else:
            folder = args.keep
            folder.mkdir(parents=True, exist_ok=True)
        port = free_port()
        bootstrap = f"127.0.0.1:{port}"
        broker = Proc(
            "broker",
            [
                "broker",
                "--engine",
                args.engine,
                *(["--storage", str(folder / "kafka")] if args.engine != "tansu" else []),
                "--port",
                str(port),
                "--log",
                str(folder / "broker.log"),
            ],
            folder,
        )
        try:
            _wait(lambda: bootstrap in broker.text(), 60, "the broker", broker)
            arms = {}
            flags = {
                "fixed": ["--max-offsets-per-trigger", str(CAP)],
                "target": [
                    "--max-offsets-per-trigger",
                    str(CAP),
                    "--freshness-target",
                    str(args.target),
                ],
            }
            kw = {"bootstrap": bootstrap, "folder": folder, "scale": args.scale}
            c: float | None = None  # the fixed arm's capacity sizes both arms' loads
            for name, extra in flags.items():
                arms[name] = run_arm(
                    name,
                    extra,
                    target=args.target,
                    load=args.load,
                    burst=args.burst,
                    capacity_rps=c,
                    **kw,
                )
                c = c or arms[name]["sized_by"]
                print(f"freshness: {name}: {arms[name]}", flush=True)
            # The capacities once more in the other order (fixed, target, target, fixed): this
            # machine's speed drifts over minutes by more than the arms differ.
            for name in reversed(flags):
                again = capacity_again(f"{name}-again", flags[name], **kw)
                arms[name]["capacity"] = (arms[name]["capacity"] + again) / 2
        finally:
            broker.signal(signal.SIGTERM)
    fixed, sized = arms["fixed"], arms["target"]
    print(
        f"freshness: fixed arm p50 {fixed['p50']:.2f} s, p99 {fixed['p99']:.2f} s, recovered "
        f"in {fixed['recovery_s']:.1f} s; the target arm's batch overhead by part (medians): "
        + ", ".join(f"{k} {v:.3f} s" for k, v in sized["overhead"].items()),
        flush=True,
    )
    print(
        f"freshness p50_s={sized['p50']:.2f} p99_s={sized['p99']:.2f} "
        f"recovery_ratio={sized['recovery_ratio']:.2f} "
        f"capacity_ratio={sized['capacity'] / fixed['capacity']:.2f} "
        f"batch_overhead_s={sized['overhead']['overhead']:.3f} capacity_rps={c:.0f}"
    )


if __name__ == "__main__":
    main()
