"""Shared memory between the parameter server and a worker on its own machine.

Over loopback TCP every 4 MB buffer is copied twice by the kernel each way: for
the MNIST CNN ~2 ms of CPU a round trip, 3 % of what two workers on two cores
have. In Spark's local mode the workers run beside the server, so each connection
may instead share one file in ``/dev/shm`` (tmpfs, mode 0600):

* the server creates it (named by a random token), reserves its pages, writes a
  random cookie at its start and sends the worker the token;
* the worker maps it and answers the cookie, which proves the file it mapped is
  the server's: a worker on another machine cannot open it, or reads another;
* the server then unlinks it. Both keep their mappings, so a crash leaves
  nothing behind, unless it comes in the moment between offer and answer; a
  server that starts removes such files once they are an hour old.

Layout: 64 bytes (the cookie, zero padded), the request payload (worker to
server), the response payload (server to worker). Each side writes its part only
between a request and its response, so the socket's round trip orders them.
"""

from __future__ import annotations

import contextlib
import glob
import mmap
import os
import secrets
import stat
import time

import numpy as np

from pipeline.train.ps.protocol import COOKIE_BYTES, ProtocolError

SHM_DIR = "/dev/shm"
PREFIX = "streamtrain-ps-"
HEADER = 64
TOKEN_BYTES = 16


def path_of(token: str) -> str:
    """The file for a token the server sent. Anything but a token of hex digits is
    refused, so a server cannot point a worker at another file.

    >>> path_of("00ff" * 8)
    '/dev/shm/streamtrain-ps-00ff00ff00ff00ff00ff00ff00ff00ff'
    >>> path_of("../../home/me/.bashrc")
    Traceback (most recent call last):
    ...
    pipeline.train.ps.protocol.ProtocolError: not a shared-memory token: '../../home/me/.bashrc'
    """
    if len(token) != 2 * TOKEN_BYTES or any(c not in "0123456789abcdef" for c in token):
        raise ProtocolError(f"not a shared-memory token: {token!r}")
    return f"{SHM_DIR}/{PREFIX}{token}"


def file_bytes(size: int) -> int:
    """The file's length for ``size`` float32 weights.

    >>> file_bytes(1000)
    8064
    """
    return HEADER + 8 * size


def remove_stale(max_age_s: float = 3600.0) -> int:
    """Remove this user's shared files older than ``max_age_s`` (left by a server killed
    between an offer and its answer; a live one unlinks within milliseconds). Returns how many."""
    removed = 0
    for path in glob.glob(f"{SHM_DIR}/{PREFIX}*"):
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if st.st_uid == os.getuid() and time.time() - st.st_mtime > max_age_s:
                os.unlink(path)
                removed += 1
    return removed


class SharedBuffers:
    """One connection's mapped file: ``request`` and ``response``, float32 views of ``size``."""

    def __init__(self, mm: mmap.mmap, size: int, path: str, token: str) -> None:
        self._mm, self.path, self.token = mm, path, token
        self.cookie = bytes(mm[:COOKIE_BYTES])
        self.request = np.frombuffer(mm, np.float32, count=size, offset=HEADER)
        self.response = np.frombuffer(mm, np.float32, count=size, offset=HEADER + 4 * size)
        self._linked = False

    @classmethod
    def create(cls, size: int) -> SharedBuffers:
        """A new file, its pages reserved, a fresh cookie at its start (the server's side).

        Raises OSError where there is no ``/dev/shm`` or no room in it.
        """
        token = secrets.token_hex(TOKEN_BYTES)
        path, length = path_of(token), file_bytes(size)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            # Reserved now: a full tmpfs fails here, rather than with SIGBUS when a page
            # of the mapping is first written mid-run.
            os.posix_fallocate(fd, 0, length)
            mm = mmap.mmap(fd, length)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        mm[:COOKIE_BYTES] = os.urandom(COOKIE_BYTES)
        shared = cls(mm, size, path, token)
        shared._linked = True
        return shared

    @classmethod
    def open(cls, token: str, size: int) -> SharedBuffers:
        """Map the server's file for ``token`` (the worker's side).

        Raises OSError when it is not there (another machine), ProtocolError when it is
        not a regular file of this user with the expected length.
        """
        path, length = path_of(token), file_bytes(size)
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size != length:
                raise ProtocolError(f"{path} is not the parameter server's shared file")
            mm = mmap.mmap(fd, length)
        finally:
            os.close(fd)
        return cls(mm, size, path, token)

    def unlink(self) -> None:
        """Remove the file's name (the server's side); the mappings stay valid."""
        if self._linked:
            self._linked = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def close(self) -> None:
        """Unlink if still linked, and unmap once no array of it is in use (else when collected)."""
        self.unlink()
        if self._mm.closed:
            return
        self.request = self.response = np.empty(
            0, np.float32
        )  # drop this object's views of the mapping
        with contextlib.suppress(BufferError):  # a caller still holds a view: unmapped when it goes
            self._mm.close()
