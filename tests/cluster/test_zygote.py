"""The zygote: modules preloaded once, children forked per request with the caller's
streams, arguments, environment and folder; the launcher Spark runs as its Python."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.cluster.zygote import Zygote, ZygoteError

MODULE = """
import os, signal, sys, time
if sys.argv[1:2] == ["wait"]:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
print("argv", sys.argv[1:], "cwd", os.getcwd(), "env", os.environ.get("ZYGOTE_TEST"),
      "preloaded", "decimal" in sys.modules,
      "sigint-ignored", signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
      "pid", os.getpid(), flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1:2] == ["wait"]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)
sys.exit(int(sys.argv[1]) if sys.argv[1:2] and sys.argv[1].isdigit() else 0)
"""


@pytest.fixture
def zygote(tmp_path: Path):
    (tmp_path / "zygote_probe_mod.py").write_text(MODULE)
    z = Zygote(["decimal"], log_path=tmp_path / "zygote.log").start()
    yield z
    z.stop()


def _env(tmp_path: Path) -> dict[str, str]:
    return {"PYTHONPATH": str(tmp_path), "ZYGOTE_TEST": "given"}


def wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_a_child_runs_the_module_with_the_callers_streams_arguments_environment_and_folder(
    zygote: Zygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    with open(out, "w") as o, open(err, "w") as e:
        child = zygote.run(
            "zygote_probe_mod",
            ["3", "x y"],
            stdout=o.fileno(),
            stderr=e.fileno(),
            env=_env(tmp_path),
        )
        assert child.wait() == 3
    said = out.read_text()
    assert "argv ['3', 'x y']" in said and f"cwd {work}" in said and "env given" in said
    assert "preloaded True" in said  # imported once in the zygote, not again in the child
    assert f"pid {child.pid}" in said and child.pid != zygote.pid
    assert err.read_text() == "to stderr\n"


def test_a_killed_child_reports_no_status(zygote: Zygote, tmp_path: Path) -> None:
    with open(os.devnull, "w") as null:
        child = zygote.run(
            "zygote_probe_mod",
            ["wait"],
            stdout=null.fileno(),
            stderr=null.fileno(),
            env=_env(tmp_path),
        )
        child.kill()
    assert child.returncode == -signal.SIGKILL
    wait_for(lambda: not Path(f"/proc/{child.pid}").exists())


def test_the_launcher_forks_modules_passes_signals_on_and_runs_anything_else_plainly(
    zygote: Zygote, tmp_path: Path
) -> None:
    python = zygote.python()
    env = {**os.environ, **_env(tmp_path)}
    # Both dispositions are set here, not inherited: the suite itself may run with SIGINT
    # ignored (a script's background job, nohup), and the child must follow its caller.
    done = subprocess.run(
        [python, "-m", "zygote_probe_mod", "5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert done.returncode == 5 and "preloaded True" in done.stdout and done.stderr == "to stderr\n"
    assert "sigint-ignored False" in done.stdout
    # Spark's JVM starts its Python ignoring SIGINT (a Ctrl-C is the driver's): so does the child.
    ignoring = subprocess.run(
        [python, "-m", "zygote_probe_mod"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert ignoring.returncode == 0 and "sigint-ignored True" in ignoring.stdout
    # Spark stops its daemon with SIGTERM: the launcher passes it on to the forked child.
    proc = subprocess.Popen(
        [python, "-m", "zygote_probe_mod", "wait"], env=env, stdout=subprocess.PIPE, text=True
    )
    line = proc.stdout.readline()  # type: ignore[union-attr]
    child = int(line.split("pid ")[1])
    assert child != proc.pid
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 7
    proc.stdout.close()  # type: ignore[union-attr]
    # Not a module to run: the plain interpreter, as Spark would have started it.
    plain = subprocess.run(
        [python, "-c", "import sys; print(sys.flags.isolated, 'decimal' in sys.modules)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.stdout.split() == ["0", "False"]


def test_with_the_zygote_gone_the_launcher_runs_the_module_itself(tmp_path: Path) -> None:
    (tmp_path / "zygote_probe_mod.py").write_text(MODULE)
    z = Zygote(["decimal"]).start()
    python = z.python()
    script = Path(python).read_text()
    z.stop()
    assert z.pid is not None and not Path(f"/proc/{z.pid}").exists()
    # The folder (script included) is gone with it; the same script elsewhere still runs.
    again = tmp_path / "python"
    again.write_text(script)
    again.chmod(0o700)
    done = subprocess.run(
        [str(again), "-m", "zygote_probe_mod", "4"],
        env={**os.environ, **_env(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 4 and "preloaded False" in done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_user_is_not_served(zygote: Zygote) -> None:
    code = (
        "import os, sys\n"
        # Imported before: nobody may not read the stdlib.
        "from pipeline.cluster.zygote import Child, ZygoteError\n"
        f"os.setgid(65534); os.setuid(65534)\ntry:\n    Child({zygote.path!r}, {{'module': "
        "'json', 'argv': [], 'env': {}, 'cwd': '/'}, (0, 1, 2)).pid\nexcept ZygoteError as "
        "e:\n    print('refused', e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.stdout.startswith("refused"), done.stdout + done.stderr


def test_a_request_for_another_interpreter_is_refused(zygote: Zygote) -> None:
    from pipeline.cluster import zygote as module

    real = sys.executable
    try:
        sys.executable = "/usr/bin/some-other-python"
        child = module.Child(
            zygote.path, {"module": "json", "argv": [], "env": {}, "cwd": "/"}, (0, 1, 2)
        )
        with pytest.raises(ZygoteError, match="refused"):
            child.pid  # noqa: B018
    finally:
        sys.executable = real
