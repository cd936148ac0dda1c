"""Benchmark: serving the MNIST CNN over HTTP against a bare Keras ``model.predict`` loop.

Arms, in one run, on the same weights (a short `streamtrain run`'s checkpoint):
  1. Keras: ``model.predict(x)`` in a loop, 1 and 64 instances a call, in a fresh
     process (``predict_on_batch`` is printed too: the floor of a call);
  2. `streamtrain serve RUN_DIR`: one keep-alive client, requests of 1 and 64
     instances back to back: requests/s, p50/p99 latency;
  3. the same against `streamtrain run --serve-port` while it trains (live weights):
     requests/s, latency, and the age of the weights each answer used;
  4. training throughput of two identical runs with --serve-port, one of them asked
     50 requests/s of one instance: the cost of serving to training.

    .venv/bin/python bench/serve.py [--seconds 8]

Last line: ``serve rps_1=<n> p99_ms_1=<n> rps_64=<n> ratio_vs_keras_64=<r> freshness_s_p50=<s>``
(ratio_vs_keras_64 = served requests/s of 64 instances over model.predict calls/s of 64)
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _images(n: int) -> np.ndarray:
    from producers import datasets

    return datasets.get("mnist").load("test").x[:n]


def keras_arm(run_dir: str, seconds: float) -> dict[str, float]:
    """Calls/s of model.predict and predict_on_batch at 1 and 64 instances (in this process)."""
    from pipeline.serve.predictor import read_description
    from pipeline.train import checkpoint
    from pipeline.train.model import set_flat
    from pipeline.train.replica import init_tensorflow

    init_tensorflow(2)
    _, spec, schema = read_description(Path(run_dir))
    model = spec.build(compile=False)
    state = checkpoint.load(run_dir)
    assert state is not None
    set_flat(model, state.weights, spec.shapes)
    out: dict[str, float] = {}
    for n in (1, 64):
        x = schema.to_model_input(_images(n))
        for name, call in (
            ("predict", lambda x=x: model.predict(x, verbose=0)),
            ("predict_on_batch", lambda x=x: model.predict_on_batch(x)),
        ):
            call()  # traced before the clock starts
            calls, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                call()
                calls += 1
            out[f"{name}_{n}"] = calls / (time.perf_counter() - started)
    return out


class Client:
    """One keep-alive HTTP client of a model server."""

    def __init__(self, port: int, model: str = "mnist") -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.path = f"/v1/models/{model}:predict"

    def predict(self, body: bytes) -> tuple[float, float]:
        """One request; (seconds it took, age of the weights used)."""
        started = time.perf_counter()
        self.conn.request(
            "POST", self.path, body=body, headers={"Content-Type": "application/json"}
        )
        resp = self.conn.getresponse()
        resp.read()
        if resp.status != 200:
            raise SystemExit(f"the model server answered {resp.status}")
        return time.perf_counter() - started, float(
            resp.getheader("X-Weights-Age-Seconds") or "nan"
        )


def load(port: int, n: int, seconds: float) -> dict[str, float]:
    """Back-to-back requests of ``n`` instances for ``seconds``: rps, p50/p99 ms, age p50."""
    body = json.dumps({"instances": _images(n).tolist()}).encode()
    client = Client(port)
    client.predict(body)
    times, ages = [], []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        took, age = client.predict(body)
        times.append(took)
        ages.append(age)
    elapsed = time.perf_counter() - started
    ms = np.array(times) * 1000
    return {
        "rps": len(times) / elapsed,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "age_p50_s": float(np.nanmedian(ages)),
    }


def _line(path: Path, marker: str, proc: subprocess.Popen[Any], timeout_s: float = 300) -> str:
    """The first line of a process's log that holds ``marker``, once it is there."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in path.read_text().splitlines():
            if marker in line:
                return line
        if proc.poll() is not None:
            raise SystemExit(f"exited early: {path.read_text()[-2000:]}")
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {marker!r}")


def _port_from(path: Path, marker: str, proc: subprocess.Popen[Any]) -> int:
    return int(_line(path, marker, proc).split("http://127.0.0.1:")[1].split("/")[0])


def _run(out: Path, *extra: str) -> subprocess.Popen[Any]:
    log = open(out.parent / f"{out.name}.log", "w")  # noqa: SIM115 - closed with the process below
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "run",
            "--out",
            str(out),
            "--eval-every",
            "1000",
            "--serve-port",
            "0",
            *extra,
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def trained_per_s(tmp: Path, name: str, rps: float) -> float:
    """records/s (excluding evaluation) of a 6-batch MNIST run, asked ``rps`` requests/s."""
    out = tmp / name
    proc = _run(out, "--max-batches", "6", "--max-offsets-per-trigger", "5000")
    port = _port_from(out.parent / f"{out.name}.log", "serving predictions at", proc)
    if rps:
        body = json.dumps({"instances": _images(1).tolist()}).encode()

        def ask() -> None:
            client = Client(port)
            for i in range(100_000):  # bounded; ends with the run
                if proc.poll() is not None:
                    return
                try:
                    client.predict(body)
                except (OSError, http.client.HTTPException, SystemExit):
                    return
                time.sleep(max(0.0, (i + 1) / rps - (time.monotonic() - began)))

        began = time.monotonic()
        threading.Thread(target=ask, daemon=True).start()
    if proc.wait(900) != 0:
        raise SystemExit(f"the run failed: {(out.parent / f'{out.name}.log').read_text()[-2000:]}")
    return float(json.loads((out / "report.json").read_text())["records_per_s_excluding_eval"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument(
        "--pairs", type=int, default=2, help="training runs with and without requests, alternated"
    )
    ap.add_argument("--keras-arm", metavar="RUN_DIR", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.keras_arm:
        print(json.dumps(keras_arm(args.keras_arm, args.seconds)))
        return

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        run_dir = tmp / "weights"
        print("training a short run for its weights ...", flush=True)
        proc = _run(run_dir, "--max-batches", "3", "--max-offsets-per-trigger", "5000")
        if proc.wait(900) != 0:
            raise SystemExit((tmp / "weights.log").read_text()[-2000:])

        done = subprocess.run(
            [sys.executable, __file__, "--keras-arm", str(run_dir), "--seconds", str(args.seconds)],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(done.stderr[-2000:])
        keras = json.loads(done.stdout.strip().splitlines()[-1])
        print("keras: " + " ".join(f"{k}={v:.1f}/s" for k, v in keras.items()), flush=True)
        # model.predict (the baseline the ratio uses) pays tf.data set-up every call;
        # predict_on_batch is the bare call, printed for comparison.

        log = tmp / "serve.log"
        with open(log, "w") as f:
            server = subprocess.Popen(
                [sys.executable, "-m", "pipeline", "serve", str(run_dir), "--port", "0"],
                cwd=ROOT,
                stdout=f,
                stderr=subprocess.STDOUT,
            )
        try:
            port = _port_from(log, "Ctrl-C stops it", server)
            idle = {n: load(port, n, args.seconds) for n in (1, 64)}
        finally:
            server.terminate()
            server.wait(30)
        for n, r in idle.items():
            print(
                f"served, idle, {n} instance(s): {r['rps']:.1f} req/s p50 {r['p50_ms']:.1f} ms "
                f"p99 {r['p99_ms']:.1f} ms",
                flush=True,
            )

        live_dir = tmp / "live"
        proc = _run(live_dir, "--epochs", "3", "--max-offsets-per-trigger", "5000")
        try:
            port = _port_from(tmp / "live.log", "serving predictions at", proc)
            _line(tmp / "live.log", "first micro-batch trained", proc)  # measured while it trains
            live = {n: load(port, n, args.seconds) for n in (1, 64)}
        finally:
            proc.terminate()
            proc.wait(120)
        for n, r in live.items():
            print(
                f"served while training, {n} instance(s): {r['rps']:.1f} req/s p50 "
                f"{r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms, weights {r['age_p50_s']:.2f} s "
                "old (p50)",
                flush=True,
            )

        # Alternated pairs, medians: one run's throughput moves by several percent on its own.
        quiet_runs, asked_runs = [], []
        for i in range(args.pairs):
            quiet_runs.append(trained_per_s(tmp, f"quiet{i}", 0))
            asked_runs.append(trained_per_s(tmp, f"asked{i}", 50))
        quiet, asked = statistics.median(quiet_runs), statistics.median(asked_runs)
        print(
            f"training records/s: {quiet:.0f} unasked {[round(q) for q in quiet_runs]}, "
            f"{asked:.0f} with 50 requests/s {[round(a) for a in asked_runs]} "
            f"({(asked / quiet - 1) * 100:+.1f}%)",
            flush=True,
        )

    freshness = statistics.median([live[1]["age_p50_s"], live[64]["age_p50_s"]])
    print(
        f"served 64 vs predict_on_batch 64: {idle[64]['rps'] / keras['predict_on_batch_64']:.2f}",
        flush=True,
    )
    print(
        f"serve rps_1={idle[1]['rps']:.1f} p99_ms_1={idle[1]['p99_ms']:.1f} "
        f"rps_64={idle[64]['rps']:.1f} "
        f"ratio_vs_keras_64={idle[64]['rps'] / keras['predict_64']:.2f} "
        f"freshness_s_p50={freshness:.2f}"
    )


if __name__ == "__main__":
    main()
