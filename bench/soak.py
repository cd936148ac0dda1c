"""Soak benchmark: a trainer that never stops, fed near its training rate for N minutes, through
a broker restart and a driver kill, checked for lost and duplicated records and for growth.

Processes, each started here by command and stopped by pid:
  - the broker: ``streamtrain broker --engine noida --storage DIR`` (it keeps its data, so it
    can be restarted);
  - the producer: ``streamtrain produce higgs --loop --rate R``;
  - the trainer: ``streamtrain run --dataset higgs --topic T --bootstrap B`` (no replay of its own).

Timeline (fractions of --minutes): at 1/6 the broker is stopped for 4 s and started again
on the same port and folder; at 1/4 the trainer's driver is SIGKILLed and resumed at once
(``--resume``); at the end the producer stops (Ctrl-C, it flushes and reports), the trainer
drains the topic and is stopped.

Sampled every 2 s: RSS of each process tree, the checkpoint's size, the lag (the topic's log
ends minus the ledger's ends in ``state.npz``), and each batch's checkpoint write time (from
``batches.jsonl``, stamped with the wall time it was first seen).

Checked at the end: the producer's acknowledged count against the topic (records lost or
appended twice by the broker); the ledger against the topic (no gap, no overlap, up to the
log end: records the trainer lost or trained twice).

    .venv/bin/python bench/soak.py --minutes 10 [--rate 1000]

Last line: ``soak minutes=<n> lost=<n> duplicated=<n> rss_growth_mb=<n> ckpt_ms_growth=<r>
lag_max=<n>``
rss_growth_mb: the trainer's processes (driver, Spark's JVM and Python workers), median RSS
of the last minute minus that of the minute from one third of the run (or from a minute
after the resumed trainer's first batch, if later: the new JVM and workers settle first).
ckpt_ms_growth: the median checkpoint write time of the last minute over that of the first.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from e2e import _tree_rss_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOPIC = "soak-higgs"
CLI = [sys.executable, "-m", "pipeline"]


def tree_rss_mb(pid: int | None) -> float:
    return _tree_rss_bytes(pid) / (1 << 20) if pid is not None else 0.0


class Proc:
    """A streamtrain command in the background, its output in a file."""

    def __init__(self, name: str, args: list[str], folder: Path) -> None:
        self.name, self.log = name, folder / f"{name}.out"
        with open(self.log, "ab") as out:
            self.p = subprocess.Popen(
                [*CLI, *args],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    @property
    def pid(self) -> int | None:
        return self.p.pid if self.p.poll() is None else None

    def signal(self, sig: int, timeout_s: float = 60) -> int:
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        return self.p.returncode

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def topic_ends(bootstrap: str) -> dict[int, int]:
    from kafka import TopicPartition

    from pipeline.ingest.kafka import client

    c = client.consumer(bootstrap)
    try:
        tps = [TopicPartition(TOPIC, p) for p in client.partitions_for(c, TOPIC)]
        return {tp.partition: n for tp, n in client.end_offsets(c, tps, timeout_s=10).items()}
    finally:
        c.close()


def ledger_of(out: Path) -> list[list[Any]]:
    from pipeline.train import checkpoint

    try:
        state = checkpoint.load(out)
    except Exception:  # written as we read: the next sample reads it whole
        return []
    return state.ledger if state is not None else []


def ledger_check(ledger: list[list[Any]], ends: dict[int, int]) -> tuple[int, int]:
    """Records of the topic the ledger misses (lost) and covers twice (duplicated)."""
    lost = dup = 0
    for part, end in ends.items():
        ranges = sorted((s, e) for _, t, p, s, e in ledger if t == TOPIC and int(p) == part)
        at = 0
        for s, e in ranges:
            if s > at:
                lost += s - at
            elif s < at:
                dup += min(at, e) - s
            at = max(at, e)
        lost += max(0, end - at)
    return lost, dup


def topic_keys(bootstrap: str, ends: dict[int, int]) -> int:
    """Records read back from the topic (to check the log ends hold what they say)."""
    from kafka import TopicPartition

    from pipeline.ingest.kafka import client

    c = client.consumer(bootstrap)
    n, deadline = 0, time.monotonic() + 120
    try:
        tps = [TopicPartition(TOPIC, p) for p in ends]
        c.assign(tps)
        c.seek_to_beginning()
        while n < sum(ends.values()) and time.monotonic() < deadline:
            n += sum(len(recs) for recs in c.poll(timeout_ms=500, max_records=50_000).values())
    finally:
        c.close()
    return n


class Soak:
    def __init__(self, minutes: float, rate: float, folder: Path) -> None:
        from pipeline.ingest.kafka.broker import free_port

        self.minutes, self.rate, self.folder = minutes, rate, folder
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.out = folder / "run"
        self.samples: list[dict[str, float]] = []
        self.ckpt: list[tuple[float, float]] = []  # (wall time first seen, checkpoint_ms)
        self._rows_seen = 0
        self.resumed_first_batch: float | None = None
        self.procs: list[Proc] = []

    def start_broker(self) -> Proc:
        b = Proc(
            "broker",
            [
                "broker",
                "--engine",
                "noida",
                "--storage",
                str(self.folder / "kafka"),
                "--port",
                str(self.port),
                "--log",
                str(self.folder / "broker.log"),
            ],
            self.folder,
        )
        self.procs.append(b)
        self._wait(lambda: self.bootstrap in b.text(), 60, "the broker")
        return b

    def start_trainer(self, resume: bool) -> Proc:
        where = ["--resume", str(self.out)] if resume else ["--out", str(self.out)]
        t = Proc(
            "trainer",
            [
                "run",
                "--dataset",
                "higgs",
                "--bootstrap",
                self.bootstrap,
                "--topic",
                TOPIC,
                "--max-offsets-per-trigger",
                "2000",
                "--eval-every",
                "1000000",
                *where,
            ],
            self.folder,
        )
        self.procs.append(t)
        return t

    def _wait(self, cond: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"soak: {what} not ready within {timeout_s:.0f} s (logs in {self.folder})"
                )
            time.sleep(0.2)

    def sample(self, t0: float, broker: Proc, producer: Proc, trainer: Proc) -> None:
        now = time.monotonic()
        rows = self.out / "batches.jsonl"
        if rows.exists():
            lines = rows.read_text().splitlines()
            for line in lines[self._rows_seen :]:
                try:
                    self.ckpt.append((now - t0, float(json.loads(line)["checkpoint_ms"])))
                except (ValueError, KeyError):
                    continue
            self._rows_seen = len(lines)
        try:
            ends = topic_ends(self.bootstrap)
            trained = {int(p): e for _, t, p, _, e in ledger_of(self.out) if t == TOPIC}
            lag = float(sum(max(0, end - trained.get(p, 0)) for p, end in ends.items()))
        except Exception:  # the broker is restarting
            lag = float("nan")
        state = self.out / "state.npz"
        self.samples.append(
            {
                "t": now - t0,
                "trainer_mb": tree_rss_mb(trainer.pid),
                "broker_mb": tree_rss_mb(broker.pid),
                "producer_mb": tree_rss_mb(producer.pid),
                "lag": lag,
                "ckpt_bytes": float(state.stat().st_size) if state.exists() else 0.0,
            }
        )

    def run(self) -> dict[str, Any]:
        total_s = self.minutes * 60
        broker = self.start_broker()
        producer = Proc(
            "producer",
            [
                "produce",
                "higgs",
                "--topic",
                TOPIC,
                "--loop",
                "--rate",
                str(self.rate),
                "--bootstrap",
                self.bootstrap,
                "--partitions",
                "2",
                "--no-progress",
                "--metrics-port",
                "0",
            ],
            self.folder,
        )
        self.procs.append(producer)
        trainer = self.start_trainer(resume=False)
        self._wait(
            lambda: "first micro-batch trained" in trainer.text(), 600, "the trainer's first batch"
        )
        t0 = time.monotonic()
        print(
            f"soak: trainer training; {self.minutes:g} minutes from now (logs in {self.folder})",
            flush=True,
        )
        restarted = killed = False
        last_print = 0.0
        while (elapsed := time.monotonic() - t0) < total_s:
            if not restarted and elapsed >= total_s / 6:
                restarted = True
                broker.signal(signal.SIGTERM)
                print(f"soak: {elapsed:5.0f} s broker stopped for 4 s", flush=True)
                time.sleep(4)  # the outage is the fault
                broker = self.start_broker()
            if not killed and elapsed >= total_s / 4:
                killed = True
                trainer.signal(signal.SIGKILL)
                print(f"soak: {elapsed:5.0f} s trainer's driver SIGKILLed; resuming", flush=True)
                trainer = self.start_trainer(resume=True)
            if (
                killed
                and self.resumed_first_batch is None
                and "first micro-batch trained" in trainer.text()
            ):
                self.resumed_first_batch = elapsed
            for p in (broker, producer, trainer):
                if p.p.poll() is not None:
                    raise SystemExit(f"soak: the {p.name} exited ({p.p.returncode}); see {p.log}")
            self.sample(t0, broker, producer, trainer)
            if elapsed - last_print >= 30:
                last_print = elapsed
                s = self.samples[-1]
                print(
                    f"soak: {elapsed:5.0f} s lag {s['lag']:>7.0f} trainer {s['trainer_mb']:6.0f} "
                    f"MB broker {s['broker_mb']:5.0f} MB checkpoint {s['ckpt_bytes'] / 1e6:.2f} "
                    "MB",
                    flush=True,
                )
            time.sleep(2)
        producer.signal(signal.SIGINT)
        sent = re.findall(r"sent (\d+) records", producer.text())
        acked = int(sent[-1]) if sent else -1
        ends = topic_ends(self.bootstrap)
        print(
            f"soak: producer stopped: {acked} records acknowledged; draining {sum(ends.values())} "
            "in the topic",
            flush=True,
        )
        self._wait(lambda: ledger_check(ledger_of(self.out), ends)[0] == 0, 300, "the drain")
        self.sample(t0, broker, producer, trainer)
        trainer.signal(signal.SIGINT)
        read_back = topic_keys(self.bootstrap, ends)
        broker.signal(signal.SIGTERM)
        lost_trainer, dup_trainer = ledger_check(ledger_of(self.out), ends)
        in_topic = sum(ends.values())
        return {
            "acked": acked,
            "in_topic": in_topic,
            "read_back": read_back,
            "lost_by_broker": max(0, acked - in_topic),
            "appended_twice": max(0, in_topic - acked),
            "lost_by_trainer": lost_trainer,
            "trained_twice": dup_trainer,
        }

    def stop_all(self) -> None:
        for p in self.procs:
            p.signal(signal.SIGKILL, timeout_s=10)


def _median_at(samples: list[dict[str, float]], key: str, lo: float, hi: float) -> float:
    vals = [s[key] for s in samples if lo <= s["t"] <= hi and s[key] == s[key]]
    return statistics.median(vals) if vals else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument(
        "--rate", type=float, default=1000, help="the producer's records/s (near the training rate)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the folder with the logs and the run")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="streamtrain-soak-"))
    soak = Soak(args.minutes, args.rate, folder)
    try:
        checks = soak.run()
    finally:
        soak.stop_all()
    total = args.minutes * 60
    s = soak.samples
    settle = max(total / 3, (soak.resumed_first_batch or 0) + 60)
    growth = _median_at(s, "trainer_mb", total - 60, total) - _median_at(
        s, "trainer_mb", settle, settle + 60
    )
    first = [ms for t, ms in soak.ckpt if t <= 60]
    last = [ms for t, ms in soak.ckpt if t >= total - 60]
    ckpt_growth = (
        statistics.median(last) / statistics.median(first) if first and last else float("nan")
    )
    lag_max = max((x["lag"] for x in s if x["lag"] == x["lag"]), default=float("nan"))
    broker_growth = _median_at(s, "broker_mb", total - 60, total) - _median_at(
        s, "broker_mb", 0, 60
    )
    print(
        json.dumps(
            {
                **checks,
                "ckpt_ms_first_minute": statistics.median(first) if first else None,
                "ckpt_ms_last_minute": statistics.median(last) if last else None,
                "ckpt_bytes_first_last": [s[0]["ckpt_bytes"], s[-1]["ckpt_bytes"]],
                "broker_rss_growth_mb": round(broker_growth, 1),
                "rss_from_s": round(settle, 1),
                "trainer_mb_every_30s": [round(x["trainer_mb"]) for x in s[::15]],
            }
        ),
        flush=True,
    )
    if not args.keep:
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
    lost = checks["lost_by_broker"] + checks["lost_by_trainer"]
    duplicated = checks["appended_twice"] + checks["trained_twice"]
    print(
        f"soak minutes={args.minutes:g} lost={lost} duplicated={duplicated} "
        f"rss_growth_mb={growth:.0f} ckpt_ms_growth={ckpt_growth:.2f} lag_max={lag_max:.0f}",
        flush=True,
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
