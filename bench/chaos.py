"""Chaos benchmark: each fault of issue 28 against a live run, then a soak that mixes them.

A live run is the soak's: ``streamtrain broker --engine noida`` (it keeps its data), the
producer looping HIGGS into a topic, and ``streamtrain run --dataset higgs --bootstrap B
--topic T`` training it (each a process started here and stopped by pid). Scenarios:

  poison_update    a parameter server under a training loop: NaN, Inf and 3e38 pushes are
                   refused and counted, the loop's every push applied, the center finite
  slow_ps_clients  the same server: 300 peers trickling their handshake; the loop keeps its
                   pace, the peers are dropped at the deadline or evicted by newer ones
  worker_flood     the same server: authenticated peers past the connection cap, claiming
                   more worker ids than it tracks; refused as busy, its tables bounded
  diverging        a run of a model compiled with a learning rate that blows up, and a run
                   whose labels flip half-way: each stops with one line naming a generation
  checkpoint       a live run stopped, its state.npz truncated, then corrupted: each resume
                   says one line naming a generation; resuming that generation trains on
  secret           a live run with a Spark secret: no process carries it in its command line
  rest_port        ``streamtrain spark-master``: Spark's REST submission port stays closed
  hostile_http     a live run serving predictions: slow heads, deep JSON, a 310-digit
                   integer, a bad Content-Length, a smuggled request; each answered, counted,
                   and a client is still served
  serve_load       the same: 64 slow clients beside a normal one, then a 20-connection
                   burst; every answer's weights within --serve-max-age
  ps_refusals      junk at the live run's parameter server reaches its /metrics
  poison_kafka     a poison batch of each of four shapes in the live topic: --on-poison skip
                   trains on and reports each; the default stops with one line naming
                   topic, partition and offset
  ps_floods        an idle flood, then a trickling flood, of 500 connections each at a live
                   run's parameter server: its records/s stays within 80% of an undisturbed
                   window's, and it trains every record once
  serve_floods     a live run's model server: 300 reconnecting slow clients and bursts of 600
                   connections beside a normal client (answered >= 95%, at most 256 held),
                   eight 15 MB string bodies (413, RSS back within 10%), a cross-site form
                   POST (415) and a rebinding Host (421)
  stationary       a HIGGS run of --stationary-minutes (20) at 600 records/s, nothing wrong:
                   it must not stop itself
  soak             one live run for --minutes with every fault above that a live run takes,
                   at intervals, and a driver kill and resume

A scenario survives when the run goes on (or stops with its one line) as specified. Lost
and duplicated records come from the ledger against the topic (poisoned offsets are in the
ledger, accounted for as skipped); tracebacks count "Traceback" in every process's log.

    .venv/bin/python bench/chaos.py [--minutes 5] [--only poison_update,poison_kafka]

Last line: ``chaos scenarios=<n> survived=<n> lost=<n> duplicated=<n> tracebacks=<n>``
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import chaos_floods  # noqa: E402
import chaos_serve  # noqa: E402
import soak  # noqa: E402
from chaos_ps import poison_update, slow_ps_clients, worker_flood  # noqa: E402
from soak import Proc, ledger_check, ledger_of, topic_ends  # noqa: E402

TOPIC = soak.TOPIC


class Live:
    """A broker, a looping producer and a trainer on ``TOPIC``, in ``folder``."""

    def __init__(self, folder: Path, *, rate: float, trainer_args: tuple[str, ...] = ()) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.s = soak.Soak(0, rate, folder)
        self.folder, self.out, self.extra = folder, self.s.out, list(trainer_args)
        self.broker = self.s.start_broker()
        self.producer = Proc(
            "producer",
            [
                "produce",
                "higgs",
                "--topic",
                TOPIC,
                "--loop",
                "--rate",
                str(rate),
                "--bootstrap",
                self.s.bootstrap,
                "--partitions",
                "2",
                "--no-progress",
                "--metrics-port",
                "0",
            ],
            folder,
        )
        self.s.procs.append(self.producer)
        self.trainer = self.start(resume=False)

    def start(self, *, resume: bool, more: tuple[str, ...] = (), name: str = "trainer") -> Proc:
        where = ["--resume", str(self.out)] if resume else ["--out", str(self.out)]
        t = Proc(
            name,
            [
                "run",
                "--dataset",
                "higgs",
                "--bootstrap",
                self.s.bootstrap,
                "--topic",
                TOPIC,
                "--max-offsets-per-trigger",
                "2000",
                "--eval-every",
                "1000000",
                *where,
                *self.extra,
                *more,
            ],
            self.folder,
        )
        self.s.procs.append(t)
        self.trainer = t
        return t

    def wait(self, text: str, timeout_s: float = 600) -> str:
        deadline = time.monotonic() + timeout_s
        while text not in (got := self.trainer.text()):
            if self.trainer.p.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no {text!r} from the trainer: {got[-600:]}")
            time.sleep(0.2)
        return got

    def drain_and_check(self, timeout_s: float = 300) -> tuple[int, int]:
        """Stop the producer, let the trainer train what the topic holds; (lost, duplicated)."""
        self.producer.signal(signal.SIGINT)
        ends = topic_ends(self.s.bootstrap)
        deadline = time.monotonic() + timeout_s
        while ledger_check(ledger_of(self.out), ends)[0] and time.monotonic() < deadline:
            time.sleep(1)
        return ledger_check(ledger_of(self.out), ends)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.folder.glob("*.out"))

    def stop(self) -> None:
        # SIGTERM, as a supervisor stops it (PySpark's own SIGINT handler prints py4j's
        # tracebacks when Ctrl-C lands inside a Spark call, which is no fault of these).
        for p in reversed(self.s.procs):  # the trainer and producer before their broker
            p.signal(signal.SIGTERM, timeout_s=60)


def _find(text: str, pattern: str) -> str:
    """The last match's group (a log may hold a run before its resume)."""
    found = re.findall(pattern, text)
    if not found:
        raise RuntimeError(f"no {pattern!r} in the log")
    return str(found[-1])


# --- faults against a live run ---------------------------------------------------------------


def checkpoint_fault(folder: Path, args: Any) -> dict[str, Any]:
    live = Live(folder, rate=args.rate)
    answers = []
    try:
        live.wait("first micro-batch trained")
        for damage, what in ((lambda b: b[: len(b) // 2], "truncated"), (_corrupt, "corrupt")):
            time.sleep(20)
            live.trainer.signal(
                signal.SIGKILL
            )  # a crash; then the disk damages the newest checkpoint
            state = live.out / "state.npz"
            state.write_bytes(damage(state.read_bytes()))
            refused = live.start(resume=True, name=f"refused-{what}")
            refused.p.wait(120)
            text = refused.text()
            generation = _find(text, r"--generation (\d+)")
            answers.append(
                refused.p.returncode != 0 and "Traceback" not in text and "is damaged:" in text
            )
            live.start(resume=True, more=("--generation", generation), name=f"resumed-{what}")
            live.wait("first micro-batch trained")
        lost, dup = live.drain_and_check()
    finally:
        live.stop()
    return {
        "survived": answers == [True, True] and not lost and not dup,
        "one_line": answers,
        "lost": lost,
        "duplicated": dup,
        "tracebacks": live.logs().count("Traceback"),
    }


def _corrupt(data: bytes) -> bytes:
    """The file's middle overwritten (a bad sector): its size whole, its zip entries not."""
    middle = len(data) // 2
    return data[:middle] + bytes(4096) + data[middle + 4096 :]


def secret_fault(folder: Path, args: Any) -> dict[str, Any]:
    from tests.cluster import proc_scan

    secret = secrets.token_hex(16)
    conf = folder / "spark.conf"
    conf.write_text(f"spark.authenticate true\nspark.authenticate.secret {secret}\n")
    conf.chmod(0o600)
    live = Live(folder, rate=args.rate, trainer_args=("--spark-conf", str(conf)))
    try:
        with proc_scan.Watch(secret) as watch:
            live.wait("first micro-batch trained")
            time.sleep(10)
        lost, dup = live.drain_and_check()
    finally:
        live.stop()
    carriers = {p: w for p, w in watch.found.items() if w.startswith("cmdline")}
    return {
        "survived": not carriers and watch.scans > 5,
        "carriers": carriers,
        "lost": lost,
        "duplicated": dup,
        "tracebacks": live.logs().count("Traceback"),
    }


def rest_port(folder: Path, args: Any) -> dict[str, Any]:
    from pipeline.ingest.kafka.broker import free_port

    port, rest = free_port(), free_port()
    env = {**os.environ, "SPARK_MASTER_OPTS": f"-Dspark.master.rest.port={rest}"}
    log = folder / "master.out"
    with open(log, "wb") as f:
        master = subprocess.Popen(
            [*soak.CLI, "spark-master", "--port", str(port), "--webui-port", "0"],
            cwd=soak.ROOT,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while (
            "elected leader" not in log.read_text(errors="replace") and time.monotonic() < deadline
        ):
            time.sleep(0.5)
        closed = socket.socket().connect_ex(("127.0.0.1", rest)) != 0
        opened = socket.socket().connect_ex(("127.0.0.1", port)) == 0
    finally:
        master.terminate()
        master.wait(30)
    return {
        "survived": closed and opened,
        "tracebacks": log.read_text(errors="replace").count("Traceback"),
    }


def _http(port: int, raw: bytes, timeout_s: float = 15) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(raw)
        got = b""
        with contextlib.suppress(TimeoutError, ConnectionError):
            while chunk := s.recv(65536):
                got += chunk
        return got


@contextlib.contextmanager
def _scenario(live: Live | None, start: Callable[[], Live]) -> Any:
    """A scenario on ``live`` (the soak's, shared) or on a run of its own from ``start``,
    which it then drains, checks for lost and duplicated records, stops and reads for
    tracebacks. Yields the live run and the result dict to fill."""
    own = live is None
    run = live or start()
    result: dict[str, Any] = {}
    try:
        yield run, result
        if own:
            result["lost"], result["duplicated"] = run.drain_and_check()
    finally:
        if own:
            run.stop()
    result["tracebacks"] = run.logs().count("Traceback") if own else 0


def hostile_http(folder: Path, args: Any, live: Live | None = None) -> dict[str, Any]:
    with _scenario(
        live, lambda: Live(folder, rate=args.rate, trainer_args=("--serve-port", "0"))
    ) as (live, result):
        text = live.wait("serving predictions at")
        port = int(_find(text, r"serving predictions at http://127\.0\.0\.1:(\d+)/"))
        path = b"/v1/models/higgs:predict"

        def post(body: bytes, head: bytes = b"") -> bytes:
            return _http(
                port,
                b"POST "
                + path
                + b" HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: "
                b"close\r\n" + head + f"Content-Length: {len(body)}\r\n\r\n".encode() + body,
            )

        slow = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
        for s in slow:
            s.send(b"POST ")
        answers = [
            post(b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
            post(b'{"instances": [[' + b"9" * 310 + b"]]}"),
            post(json.dumps({"instances": [["1"] * 28]}).encode()),
            _http(
                port,
                b"POST " + path + b" HTTP/1.1\r\nHost: localhost\r\nContent-Length: abc\r\n\r\n{}",
            ),
        ]
        good = post(json.dumps({"instances": [[0.5] * 28]}).encode())
        for s in slow:
            s.close()
        statuses = [
            a.split(b" ")[1].decode() if a.startswith(b"HTTP/") else "none" for a in answers
        ]
        ok = statuses == ["400", "400", "400", "400"] and good.split(b" ")[1] in (b"200", b"503")
        result.update(survived=ok, statuses=statuses, good=good[:12].decode(errors="replace"))
    return result


def serve_load(folder: Path, args: Any, live: Live | None = None) -> dict[str, Any]:
    with _scenario(
        live, lambda: Live(folder, rate=args.rate, trainer_args=("--serve-port", "0"))
    ) as (live, result):
        text = live.wait("serving predictions at")
        port = int(_find(text, r"serving predictions at http://127\.0\.0\.1:(\d+)/"))
        result.update(chaos_serve.load(port, model="higgs", max_age_s=1.0))
    return result


def diverging(folder: Path, args: Any) -> dict[str, Any]:
    """A model compiled with a learning rate that blows up (the weights leave float32), and
    labels that flip half-way (the held-out score collapses with finite numbers): each run
    stops with one line naming a kept generation, before committing the batch."""
    from tests.jobs.test_divergence import _table

    (folder / "blowup.py").write_text(
        "import keras\n\n\ndef build():\n    m = keras.Sequential([keras.Input((28,)), "
        "keras.layers.Dense(64, activation='relu'),\n                          "
        "keras.layers.Dense(2, activation='softmax')])\n    "
        "m.compile(keras.optimizers.SGD(learning_rate=1e6), "
        "'sparse_categorical_crossentropy')\n    "
        "return m\n"
    )
    _table(folder / "train.csv", 14_000, flip_after=6_000, seed=1)
    _table(folder / "eval.csv", 1_000, flip_after=None, seed=2)
    runs = {
        "blowup": ["--dataset", "higgs", "--model", f"{folder / 'blowup.py'}:build"],
        "flipped": [
            "--data",
            str(folder / "train.csv"),
            "--label",
            "y",
            "--eval-data",
            str(folder / "eval.csv"),
            "--workers",
            "1",
            "--seed",
            "3",
        ],
    }
    result: dict[str, Any] = {"tracebacks": 0}
    for name, options in runs.items():
        out = folder / name
        done = subprocess.run(
            [
                *soak.CLI,
                "run",
                *options,
                "--max-offsets-per-trigger",
                "1000",
                "--eval-every",
                "1",
                "--out",
                str(out),
                "--timeout",
                "300",
            ],
            cwd=soak.ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        errors = [
            line for line in done.stderr.splitlines() if line.startswith("streamtrain: error:")
        ]
        kept = re.findall(r"--generation (\d+)", errors[0]) if len(errors) == 1 else []
        from pipeline.train import checkpoint

        # The way on: a kept generation, or (stopped in its first batch) a new run.
        way = (
            int(kept[0]) in checkpoint.generations(out)
            if kept
            else bool(errors) and "start again" in errors[0]
        )
        result[name] = (
            done.returncode != 0 and way and ("diverged" in errors[0] or "collapsed" in errors[0])
        )
        result[f"{name}_line"] = errors[0][:200] if errors else done.stderr[-300:]
        result["tracebacks"] += done.stderr.count("Traceback")
    result["survived"] = result["blowup"] and result["flipped"]
    return result


def ps_refusals(folder: Path, args: Any, live: Live | None = None) -> dict[str, Any]:
    with _scenario(live, lambda: Live(folder, rate=args.rate)) as (live, result):
        text = live.wait("first micro-batch trained")
        host, port = _find(text, r"parameter server at ([\d.]+:\d+)").split(":")
        metrics = _find(text, r"metrics at (http://\S+)")
        for _ in range(5):
            with socket.create_connection((host, int(port)), timeout=5) as s:
                s.recv(16)
                s.sendall(b"GET / HTTP/1.1\r\n" + bytes(48))  # not the proof of the secret
        deadline, seen = time.monotonic() + 30, 0.0
        while seen < 5 and time.monotonic() < deadline:
            body = urllib.request.urlopen(metrics, timeout=5).read().decode()  # noqa: S310 (loopback)
            seen = float(_find(body, r'streamtrain_ps_refusals_total\{reason="auth"\} (\S+)'))
            time.sleep(0.5)
        result.update(survived=seen >= 5, auth_refusals_on_metrics=seen)
    return result


def _shapes() -> dict[str, bytes]:
    """Record batches no client writes, each with a valid CRC (a broker stores them as sent)."""
    import gzip
    import struct

    import crc32c

    from tests.ingest import raw_batches

    records = [(b"k", b"v")] * 3
    lie = bytearray(raw_batches.batch(records))
    struct.pack_into(">i", lie, 57, 100_000_000)  # the record count, inside the CRC's span
    struct.pack_into(">I", lie, 17, crc32c.crc32c(bytes(lie[21:])))
    return {
        "corrupt_zstd": raw_batches.batch(records, codec=4, payload=b"\x28\xb5\x2f\xfd not zstd"),
        "cut_gzip": raw_batches.batch(
            records, codec=1, payload=gzip.compress(raw_batches.records_body(records))[:-9]
        ),
        "unknown_codec": raw_batches.batch(records, codec=6, payload=b"no codec has this number"),
        "count_lie": bytes(lie),
    }


def _poison(bootstrap: str, partition: int, shape: str = "corrupt_zstd") -> None:
    from tests.ingest import raw_batches

    if raw_batches.produce(bootstrap, TOPIC, partition, _shapes()[shape]) != 0:
        raise RuntimeError(f"the broker refused the poison batch ({shape})")


def poison_kafka(folder: Path, args: Any) -> dict[str, Any]:
    live = Live(folder / "skip", rate=args.rate, trainer_args=("--on-poison", "skip"))
    try:
        live.wait("first micro-batch trained")
        for i, shape in enumerate(_shapes()):
            _poison(live.s.bootstrap, i % 2, shape)
            time.sleep(5)
        time.sleep(10)
        lost, dup = live.drain_and_check()
        live.trainer.signal(signal.SIGTERM)
        rows = [json.loads(line) for line in (live.out / "batches.jsonl").read_text().splitlines()]
        poison = [p for row in rows for p in row.get("poison", [])]
        skipped_ok = len(poison) == len(_shapes()) and all(
            p["last"] - p["first"] == 2 for p in poison
        )
        tracebacks = live.logs().count("Traceback")
    finally:
        live.stop()
    live = Live(folder / "fail", rate=args.rate)
    try:
        live.wait("first micro-batch trained")
        _poison(live.s.bootstrap, 1)
        live.trainer.p.wait(300)
        text = live.trainer.text()
        stopped_ok = live.trainer.p.returncode != 0 and f"Cannot read {TOPIC}-1 at offset" in text
        tracebacks += live.logs().count("Traceback")
    finally:
        live.stop()
    return {
        "survived": skipped_ok and stopped_ok and not lost and not dup,
        "poison": poison,
        "lost": lost,
        "duplicated": dup,
        "tracebacks": tracebacks,
    }


def ps_floods(folder: Path, args: Any) -> dict[str, Any]:
    with _scenario(None, lambda: Live(folder, rate=args.rate)) as (live, result):
        result.update(chaos_floods.ps_floods(live))
    return result


def serve_floods(folder: Path, args: Any) -> dict[str, Any]:
    with _scenario(
        None, lambda: Live(folder, rate=args.rate, trainer_args=("--serve-port", "0"))
    ) as (live, result):
        result.update(chaos_floods.serve_floods(live))
    return result


def stationary(folder: Path, args: Any) -> dict[str, Any]:
    return chaos_floods.stationary(folder, args.stationary_minutes)


def soak_mix(folder: Path, args: Any) -> dict[str, Any]:
    live = Live(folder, rate=args.rate, trainer_args=("--on-poison", "skip", "--serve-port", "0"))
    rounds, failures = 0, []
    try:
        live.wait("first micro-batch trained")
        t0, killed = time.monotonic(), False
        while time.monotonic() - t0 < args.minutes * 60 and rounds < 1000:  # bounded
            rounds += 1
            for name, fault in (("http", hostile_http), ("serve", serve_load), ("ps", ps_refusals)):
                if not fault(folder, args, live=live)["survived"]:
                    failures.append(f"{name} round {rounds}")
            _poison(live.s.bootstrap, rounds % 2, list(_shapes())[rounds % 4])
            if (
                not killed and time.monotonic() - t0 > args.minutes * 20
            ):  # a third of the way: kill, resume
                killed = True
                live.trainer.signal(signal.SIGKILL)
                live.start(
                    resume=True, name="resumed"
                )  # a log of its own: its port, its first batch
                live.wait("first micro-batch trained")
            time.sleep(10)
        lost, dup = live.drain_and_check()
    finally:
        live.stop()
    return {
        "survived": not failures,
        "rounds": rounds,
        "failures": failures,
        "lost": lost,
        "duplicated": dup,
        "tracebacks": live.logs().count("Traceback"),
    }


SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {
    "poison_update": poison_update,
    "slow_ps_clients": slow_ps_clients,
    "worker_flood": worker_flood,
    "diverging": diverging,
    "checkpoint": checkpoint_fault,
    "secret": secret_fault,
    "rest_port": rest_port,
    "hostile_http": hostile_http,
    "serve_load": serve_load,
    "ps_refusals": ps_refusals,
    "poison_kafka": poison_kafka,
    "ps_floods": ps_floods,
    "serve_floods": serve_floods,
    "stationary": stationary,
    "soak": soak_mix,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5, help="the soak's length")
    ap.add_argument("--rate", type=float, default=1000, help="the producer's records/s")
    ap.add_argument(
        "--stationary-minutes", type=float, default=20, help="the stationary run's length"
    )
    ap.add_argument("--only", help="comma-separated scenarios (default: all)")
    ap.add_argument("--keep", action="store_true", help="keep the folder with the logs")
    args = ap.parse_args()
    names = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        raise SystemExit(
            f"chaos: expected scenarios among {', '.join(SCENARIOS)}. Received: "
            f"{', '.join(unknown)}"
        )
    root = Path(tempfile.mkdtemp(prefix="streamtrain-chaos-"))
    totals = {"survived": 0, "lost": 0, "duplicated": 0, "tracebacks": 0}
    for name in names:
        folder = root / name
        folder.mkdir()
        started = time.monotonic()
        try:
            result = SCENARIOS[name](folder, args)
        except Exception as e:  # a scenario that could not run did not survive
            result = {"survived": False, "error": f"{type(e).__name__}: {e}"}
        result["seconds"] = round(time.monotonic() - started, 1)
        print(f"chaos: {name}: {json.dumps(result, default=str)}", flush=True)
        totals["survived"] += bool(result["survived"])
        for key in ("lost", "duplicated", "tracebacks"):
            totals[key] += int(result.get(key, 0))
    if not args.keep:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"chaos: logs in {root}", flush=True)
    print(
        f"chaos scenarios={len(names)} survived={totals['survived']} lost={totals['lost']} "
        f"duplicated={totals['duplicated']} tracebacks={totals['tracebacks']}",
        flush=True,
    )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
