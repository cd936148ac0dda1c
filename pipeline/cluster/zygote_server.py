"""The zygote process: the modules imported once, then a child forked per request.

:class:`~pipeline.cluster.zygote.Zygote` starts it on a socket it has bound; the requests
come from :class:`~pipeline.cluster.zygote.Child` (the driver's, and the launcher's that
Spark runs as its Python). Each request is checked (the peer's user id, the interpreter it
means, the header's size) before a child is forked; the child takes the caller's streams,
environment, folder and arguments and runs the module as ``__main__``.

    python -m pipeline.cluster.zygote_server FD MODULE...   (FD: the bound socket)
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import signal
import socket
import struct
import sys
from collections.abc import Sequence
from typing import Any

from pipeline.cluster.zygote import MAX_HEADER, STATUS


def _preload(modules: Sequence[str]) -> None:
    stdout, sys.stdout = sys.stdout, sys.stderr  # nothing a library prints reaches a child's stdout
    try:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as e:  # children import it themselves, and fail there if they must
                print(
                    f"streamtrain zygote: {name} not preloaded: {type(e).__name__}: {e}",
                    file=sys.stderr,
                )
    finally:
        sys.stdout = stdout


def _serve(listener: socket.socket) -> None:
    import selectors

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(0, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj == 0:
                if not os.read(0, 4096):
                    return  # the run closed its end: it is over
                continue
            conn, _ = listener.accept()
            with contextlib.suppress(OSError, ValueError):
                _accept(conn, listener)
            conn.close()


def _accept(conn: socket.socket, listener: socket.socket) -> None:
    conn.settimeout(10)
    _, uid, _ = struct.unpack(
        "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    )
    head, fds, _, _ = socket.recv_fds(conn, 4 + MAX_HEADER, 3)
    try:
        size = struct.unpack("!I", head[:4])[0] if len(head) >= 4 else -1
        if uid != os.getuid() or len(fds) != 3 or not 0 <= size <= MAX_HEADER:
            conn.sendall(STATUS.pack(0))
            return
        body = head[4:]
        while len(body) < size:
            chunk = conn.recv(size - len(body))
            if not chunk:
                return
            body += chunk
        header = json.loads(body)
        if header.get("executable") != sys.executable or not isinstance(header.get("module"), str):
            conn.sendall(STATUS.pack(0))  # a child must be the interpreter its caller meant
            return
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                listener.close()
                code = _child(conn, header, fds)
            finally:
                os._exit(code)
        conn.sendall(STATUS.pack(pid))
    finally:
        for fd in fds:
            os.close(fd)


def _child(conn: socket.socket, header: dict[str, Any], fds: list[int]) -> int:
    """In the forked child: take the caller's streams, environment, folder and arguments,
    run the module as ``__main__``, and report its status on the connection."""
    import runpy

    conn.settimeout(None)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(
        signal.SIGINT,
        signal.SIG_IGN if header.get("sigint") == "ignore" else signal.default_int_handler,
    )
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    env = header["env"]
    os.environ.clear()
    os.environ.update(env)
    for entry in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
    os.chdir(header["cwd"])
    sys.argv = [header["module"], *header["argv"]]
    # ``python -m`` runs a fresh copy of the module as __main__; a preloaded one left in
    # sys.modules only makes runpy warn (what it imported stays loaded either way).
    sys.modules.pop(header["module"], None)
    code: Any = 0
    try:
        runpy.run_module(header["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    code = code if isinstance(code, int) else 0 if code is None else 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):
        conn.sendall(STATUS.pack(code))
    return code


def serve(fd: int, modules: Sequence[str]) -> None:
    listener = socket.socket(fileno=fd)
    signal.signal(
        signal.SIGINT, signal.SIG_IGN
    )  # the run stops it; a Ctrl-C is the run's to handle
    _preload(modules)
    # What the imports made is kept for good: a child's collections then never walk (and so
    # never copy) the pages it shares with its siblings.
    gc.collect()
    gc.freeze()
    _serve(listener)


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2:])
