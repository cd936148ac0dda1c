"""A preloaded parent process: modules imported once, then a child forked per request.

TensorFlow takes seconds to import, and PySpark with pandas and Arrow one more, in every
process that uses them: each Spark Python worker, each of the helper processes a query
with a Python data source starts (one after another, before its first batch), the
model's describer. A run starts the zygote first, beside the broker and Spark's JVM, so
the import overlaps them; a child forked from it afterwards starts with those modules
loaded, in milliseconds, and shares their pages with its siblings (copy-on-write)
instead of holding its own copy.

Spark runs its Python through :meth:`Zygote.python`, a two-line script that starts this
file as a launcher (``python -I -S``: no site, nothing but the standard library, ~15
ms). For ``-m MODULE ARGS`` the launcher hands the zygote its standard streams,
arguments, environment and folder; the child forked there runs the module as
``__main__`` on them, while the launcher stays as the process Spark knows: it passes on
SIGTERM and SIGHUP (and SIGINT, unless it was started ignoring it, as Spark starts its
Python: then so does the child), and exits with the child's status. Anything else, or no
zygote answering, and it becomes the plain interpreter (``exec``), as Spark would have run.

Fork safety: only imports happen in the zygote, never a TensorFlow operation, so no
TensorFlow thread pool exists to be lost in a child (a child's first operation creates
them, with the thread count it sets). The threads the imports start are an OpenBLAS pool
and jemalloc's background thread, both of which prepare for fork. PySpark's own daemon
imports nothing before it forks for that reason; ``STREAMTRAIN_PRELOAD=false`` goes back
to it.

Security: the socket is in a folder only this user can open, and the zygote serves only
a peer of its own user id (``SO_PEERCRED``). Requests are JSON; nothing is unpickled.

This module is the zygote's clients: the driver's handle (:class:`Zygote`), a request
(:class:`Child`) and the launcher, which runs this file with the standard library alone.
The zygote process itself, preloading and forking, is :mod:`pipeline.cluster.zygote_server`.

    python -m pipeline.cluster.zygote_server FD MODULE...   (FD: the bound socket)
    python -I -S zygote.py launch SOCKET PYTHON_ARGS...
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: What both ends of a request share: the largest JSON header, and the status (a pid, then
#: the exit status) the zygote answers with.
MAX_HEADER = 1 << 20
STATUS = struct.Struct("!i")


class ZygoteError(RuntimeError):
    """The zygote refused or dropped a request (it is gone, or runs another interpreter)."""


class Zygote:
    """The driver's handle on a zygote process; :meth:`stop` ends it.

    The listening socket is bound here, before the process starts, so a request made
    while it still imports waits in the socket's queue instead of failing.
    """

    def __init__(self, preload: Sequence[str], *, log_path: Path | None = None) -> None:
        self.preload = list(preload)
        self.log_path = log_path
        self.folder = Path(tempfile.mkdtemp(prefix="streamtrain-zygote-"))  # mode 0700
        self.path = str(self.folder / "socket")
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Zygote:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(64)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pipeline.cluster.zygote_server",
                    str(listener.fileno()),
                    *self.preload,
                ],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=log,
                pass_fds=(listener.fileno(),),
                # Its own process group: a Ctrl-C reaches the run, which stops it by pid.
                # PySpark refuses workers whose string hashing is random: its children hash alike.
                process_group=0,
                env={
                    **os.environ,
                    "TF_CPP_MIN_LOG_LEVEL": "2",
                    "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0"),
                },
            )
        finally:
            listener.close()
            if log is not subprocess.DEVNULL:
                log.close()  # type: ignore[union-attr]
        return self

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def python(self) -> str:
        """An executable that Spark can run as its Python (``PYSPARK_PYTHON``): modules it
        is asked to run are forked from this zygote."""
        script = self.folder / "python"
        if not script.exists():
            script.write_text(
                f"#!/bin/sh\nexec {_quote(sys.executable)} -I -S {_quote(__file__)} launch "
                f'{_quote(self.path)} "$@"\n'
            )
            script.chmod(0o700)
        return str(script)

    def run(
        self,
        module: str,
        argv: Sequence[str],
        *,
        stdout: int,
        stderr: int,
        env: dict[str, str] | None = None,
    ) -> Child:
        """Run ``module`` as ``python -m module *argv`` would, in a child forked from the
        zygote, its output to the given descriptors; the :class:`Child` waits for its status."""
        stdin = os.open(os.devnull, os.O_RDONLY)
        try:
            return Child(
                self.path,
                {
                    "module": module,
                    "argv": list(argv),
                    "env": {**os.environ, **(env or {})},
                    "cwd": os.getcwd(),
                },
                (stdin, stdout, stderr),
            )
        finally:
            os.close(stdin)  # the zygote received its own copy

    def stop(self) -> None:
        """End the zygote. Its children end on their own: Spark's when the JVM closes
        their input or stops them, run children when their module returns."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()  # it exits when its input closes
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class Child:
    """A child the zygote forks for one request: its pid and, once it ends, its exit status.

    The request is sent at construction; the zygote answers once its imports are done, so
    the pid is read when first asked for. Raises :class:`ZygoteError` if nothing listens.
    """

    def __init__(self, path: str, header: dict[str, Any], fds: tuple[int, int, int]) -> None:
        self.path = path
        self.returncode: int | None = None
        self._pid: int | None = None
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._conn.connect(path)
            body = json.dumps({**header, "executable": sys.executable}).encode()
            # The descriptors travel as SCM_RIGHTS: the zygote gets its own copies.
            socket.send_fds(self._conn, [struct.pack("!I", len(body)) + body], list(fds))
        except OSError as e:
            self._conn.close()
            raise ZygoteError(f"no zygote at {path}: {e}") from None

    @property
    def pid(self) -> int:
        """The child's pid (waits for the fork). Raises :class:`ZygoteError` if the zygote
        refused the request (another interpreter, another user) or is gone."""
        if self._pid is None:
            try:
                reply = _recv_exactly(self._conn, STATUS.size)
            except OSError:
                reply = b""
            if not reply or STATUS.unpack(reply)[0] <= 0:
                self._conn.close()
                raise ZygoteError(f"the zygote at {self.path} refused the request or is gone")
            self._pid = STATUS.unpack(reply)[0]
        return self._pid

    def wait(self) -> int:
        """Its exit status; -9 if it ended without reporting one (killed, or never forked)."""
        if self.returncode is None:
            try:
                self.pid  # noqa: B018  (the pid comes first on the connection)
                data = _recv_exactly(self._conn, STATUS.size)
            except (ZygoteError, OSError):
                data = b""
            self._conn.close()
            self.returncode = STATUS.unpack(data)[0] if data else -signal.SIGKILL
        return self.returncode

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, ZygoteError):
            os.kill(self.pid, signum)

    def kill(self) -> None:
        if self.returncode is None:
            self.signal(signal.SIGKILL)
            self.wait()


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    """``n`` bytes, or b"" if the peer closed first."""
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def _quote(text: str) -> str:
    """``text`` quoted for sh.

    >>> _quote("/a b/it's")
    "'/a b/it'\\\\''s'"
    """
    return "'" + text.replace("'", "'\\''") + "'"


# --- the launcher Spark runs as its Python ---


def launch(path: str, args: list[str]) -> None:
    """``python ARGS`` with ``-m MODULE`` forked from the zygote at ``path``; else the plain
    interpreter. Never returns."""
    if len(args) >= 2 and args[0] == "-m":
        # Spark starts its Python with SIGINT ignored (a Ctrl-C is the driver's to handle):
        # the child keeps that, and only a SIGINT this process would act on is passed on.
        ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        try:
            child = Child(
                path,
                {
                    "module": args[1],
                    "argv": args[2:],
                    "env": dict(os.environ),
                    "cwd": os.getcwd(),
                    "sigint": "ignore" if ignored else "default",
                },
                (0, 1, 2),
            )
            child.pid  # noqa: B018  (forked: the zygote took the request)
        except ZygoteError:
            pass  # the zygote is gone or refused: run as Spark would have
        else:
            for signum in (signal.SIGTERM, signal.SIGHUP, *(() if ignored else (signal.SIGINT,))):
                signal.signal(signum, lambda s, _frame: child.signal(s))
            # Its standard streams are the child's now: hold none open here, so Spark sees
            # their end when the child ends, whatever becomes of this process.
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            code = child.wait()
            os._exit(code if 0 <= code < 256 else 1)
    os.execv(sys.executable, [sys.executable, *args])


if __name__ == "__main__":
    if sys.argv[1:2] != ["launch"]:
        sys.exit("usage: python -I -S zygote.py launch SOCKET PYTHON_ARGS...")
    launch(sys.argv[2], sys.argv[3:])
