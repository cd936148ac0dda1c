"""Child processes of a run: spawned, tied to their parent's life, their output in a log
file, their answer (or their error) back through a pipe, and signals turned into an event.

The run's replay producer and its model server are such children
(:mod:`pipeline.jobs.replay_process`, :mod:`pipeline.serve.process`). They are spawned,
not forked: the driver holds Spark's JVM gateway, threads and sockets. This module
imports nothing of Spark or training, so a producer can use it.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: What a child runs: ``main(job, answer, stop)``; ``answer`` sends the parent one value
#: (picklable), ``stop`` is set by SIGINT or SIGTERM.
Main = Callable[[dict[str, Any], Callable[[Any], None], threading.Event], None]


@dataclasses.dataclass(frozen=True)
class ChildFailed:
    """The answer of a child whose ``main`` raised: the error, on one line."""

    error: str


def die_with_parent(parent: int | None = None) -> None:
    """Ask the kernel to SIGTERM this process when its parent dies (Linux), so that a
    SIGKILLed test or driver leaves no orphan broker, producer or model server.

    In a child between fork and exec (``preexec_fn``), or first thing in a spawned one;
    with ``parent`` (the pid that started it), a parent already gone ends it at once.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def stop_on_signals(
    stop: threading.Event, *, again_exits: bool = True, received: list[int] | None = None
) -> Iterator[threading.Event]:
    """While inside, SIGINT and SIGTERM set ``stop`` rather than raise KeyboardInterrupt;
    with ``again_exits``, a second one exits at once (status 130) without cleaning up.
    ``received`` gets each signal's number (a caller's exit status may depend on which).

    Why: kafka-python runs its event loop in the calling thread during metadata, topic
    and send calls, and logs and drops any exception raised inside a task there, a
    KeyboardInterrupt included; a Ctrl-C that landed in one was lost and the producer
    ran on. A flag that the work loop reads cannot be lost. Main thread only.
    """
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handle(signum: int, _frame: Any) -> None:
        if again_exits and stop.is_set():
            sys.stderr.write("interrupted again: exiting without waiting for Kafka\n")
            sys.stderr.flush()
            os._exit(130)
        if received is not None:
            received.append(signum)
        stop.set()

    for sig in previous:
        signal.signal(sig, handle)
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def stop_gracefully(request: Callable[[str], None]) -> Iterator[None]:
    """While inside, the first SIGINT or SIGTERM calls ``request`` with the signal's name
    (the work loop then ends as it would at its own end); a second one exits at once, with
    128 + its number, leaving the children to their parent-death signal. Main thread only.

    Why: ``docker compose stop`` sends SIGTERM, and Python's default ends the process on
    the spot; PySpark's own SIGINT handler cancels every job from inside the handler,
    which breaks the call the main thread is in (py4j tracebacks, no report).
    """
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    seen: list[int] = []

    def handle(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if seen:
            sys.stderr.write(
                f"{name} again: stopping at once (the last checkpoint stands; resume from it)\n"
            )
            sys.stderr.flush()
            os._exit(128 + signum)
        seen.append(signum)
        request(name)

    for sig in previous:
        signal.signal(sig, handle)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def leave_terminal_group() -> None:
    """Leave the terminal's foreground process group, so that a Ctrl-C there reaches the
    parent alone, which stops this child in its own time (a run's broker, replay and model
    server would otherwise die of it mid-batch). In a child, first thing."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)


def wait(stop: threading.Event) -> None:
    """Block until ``stop`` is set, in short steps (so that a signal handler runs promptly)."""
    while not stop.wait(0.5):
        pass


#: In a spawned child: its end of the pipe to the parent (see :func:`from_parent`).
_parent_pipe: Any = None


def from_parent(timeout_s: float) -> Any:
    """In a spawned child: what its parent sent with :meth:`ChildProcess.send` (None when
    nothing came within ``timeout_s``); raises EOFError once the parent closed the pipe."""
    if _parent_pipe is None or not _parent_pipe.poll(timeout_s):
        return None
    return _parent_pipe.recv()


def _child(main: Main, what: str, job: dict[str, Any], report: Any, log_path: str) -> None:
    """A spawned child's entry point: its output to ``log_path`` (nobody reads a pipe while a
    run streams), tied to its parent, ``main`` run with a stop event; an error goes back as
    :class:`ChildFailed`, for the parent to turn into one line."""
    with open(log_path, "a") as f:  # stdout and stderr, C libraries' included
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname).1s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    job = dict(job)
    parent = job.pop("parent", None)
    global _parent_pipe
    _parent_pipe = report
    try:
        with stop_on_signals(threading.Event()) as stop:  # the parent stops it with a signal
            leave_terminal_group()
            die_with_parent(parent)  # a driver killed outright leaves no child behind
            main(job, report.send, stop)
    except Exception as e:
        log.error("%s failed: %s: %s", what, type(e).__name__, e)
        report.send(ChildFailed(f"{type(e).__name__}: {e}"))


class ChildProcess:
    """A spawned child that runs ``main`` and answers through a pipe.

    Args:
        main: a module-level function (the child imports its module afresh).
        job: its settings (picklable); the parent's pid is added, so that the child ends
            with it.
        name: the process's name.
        what: the child in its log's words (``the replay``).
        log_path: the child's output.
        stop_signal: what :meth:`stop` sends first (it kills the child 10 s later).
    """

    def __init__(
        self,
        main: Main,
        job: dict[str, Any],
        *,
        name: str,
        what: str,
        log_path: Path,
        stop_signal: int = signal.SIGTERM,
    ) -> None:
        self.main, self.job, self.name, self.what, self.log_path = main, job, name, what, log_path
        self.stop_signal = stop_signal
        self._process: Any = None
        self._answers: Any = None

    def start(self) -> ChildProcess:
        ctx = multiprocessing.get_context("spawn")
        self._answers, child_end = (
            ctx.Pipe()
        )  # both ways: the child answers, and may be sent work later
        self._process = ctx.Process(
            target=_child,
            args=(
                self.main,
                self.what,
                {**self.job, "parent": os.getpid()},
                child_end,
                str(self.log_path),
            ),
            name=self.name,
            daemon=True,
        )
        self._process.start()
        child_end.close()
        return self

    def send(self, message: Any) -> None:
        """Send the child ``message`` (it reads it with :func:`from_parent`)."""
        self._answers.send(message)

    @property
    def exitcode(self) -> int | None:
        return self._process.exitcode if self._process is not None else None

    def ready(self, timeout_s: float = 0.0) -> bool:
        """Whether an answer (or the end of the child) can be received now."""
        return self._process is not None and bool(self._answers.poll(timeout_s))

    def receive(self) -> Any:
        """The child's answer (:class:`ChildFailed` where its ``main`` raised); raises
        EOFError where it exited without one (waiting a little for its exit code)."""
        try:
            return self._answers.recv()
        except EOFError:
            self._process.join(5)
            raise

    def stop(self) -> None:
        """Signal the child, wait for it (10 s at most, then kill it), close the pipe."""
        proc = self._process
        if proc is not None and proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, self.stop_signal)
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        if self._answers is not None:
            self._answers.close()
