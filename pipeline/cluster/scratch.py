"""One folder for every temporary file of a run and of the processes it starts, removed at
the run's end, and by the next run on the machine when a kill left it behind.

Python's ``tempfile`` (TensorFlow's ``__autograph_generated_file*.py``, one per traced
function; the model's describer; the zygote's socket folder), PySpark and the processes
spawned or forked later all take the folder from ``TMPDIR``, Spark's own files from
``SPARK_LOCAL_DIRS``, and Spark's JVM its ``java.io.tmpdir`` from ``SPARK_SUBMIT_OPTS`` (on
Linux it would be /tmp whatever ``TMPDIR`` says); all are set for the run's life. Each run's folder
sits in ``<system temp>/streamtrain-<uid>/`` and holds a lock its run keeps open: a folder whose
lock anyone can take belongs to a run that is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.errors import ConfigError

#: A run's folder has its lock within a moment of being made; one without a lock older than
#: this was left by a run killed in that moment.
_UNLOCKED_GRACE_S = 60.0
_LOCK = ".owner"
#: What points a run's processes at its folder.
_VARIABLES = ("TMPDIR", "SPARK_LOCAL_DIRS", "SPARK_SUBMIT_OPTS")


def base(parent: str | os.PathLike[str] | None = None) -> Path:
    """``<parent>/streamtrain-<uid>`` (the system temp folder by default), made this user's
    alone; refused if another user owns it or anyone else may write in it (in a shared
    /tmp, a folder another user made first could be theirs to read or swap)."""
    folder = Path(parent or tempfile.gettempdir()) / f"streamtrain-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise ConfigError(
            f"Expected {folder} to be a folder of this user's alone, for runs' temporary files. "
            "Received: "
            f"{'a link or file' if not stat.S_ISDIR(info.st_mode) else 'one others can use'}. "
            "Remove it, or point TMPDIR at a folder of your own."
        )
    return folder


def sweep(folder: Path) -> list[Path]:
    """Remove the run folders in ``folder`` whose runs are gone (their lock is free);
    return those removed."""
    removed = []
    for run in folder.iterdir():
        if not run.is_dir() or run.is_symlink():
            continue
        try:
            fd = os.open(run / _LOCK, os.O_RDWR)
        except FileNotFoundError:
            if time.time() - run.lstat().st_mtime < _UNLOCKED_GRACE_S:
                continue  # a run making its folder right now
            fd = -1
        try:
            if fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # its run is alive
            shutil.rmtree(run, ignore_errors=True)
            removed.append(run)
        finally:
            if fd >= 0:
                os.close(fd)
    return removed


@contextlib.contextmanager
def scratch(parent: str | os.PathLike[str] | None = None) -> Iterator[Path]:
    """While inside: a folder of this run's own for every temporary file, in ``TMPDIR`` and
    ``SPARK_LOCAL_DIRS`` (for the processes started inside) and ``tempfile.tempdir`` (for
    this one); the folders of runs that were killed are removed first. On the way out: the
    folder is removed and the variables are as they were.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as parent:
        ...     with scratch(parent) as folder:
        ...         inside = Path(tempfile.mkdtemp()).parent == folder == Path(os.environ["TMPDIR"])
        ...     (
        ...         inside,
        ...         folder.exists(),
        ...         [p.name for p in Path(parent).iterdir()] == [f"streamtrain-{os.getuid()}"],
        ...     )
        (True, False, True)
    """
    folder = base(parent)
    sweep(folder)
    own = Path(tempfile.mkdtemp(prefix="run-", dir=folder))
    lock = os.open(own / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    before = {name: os.environ.get(name) for name in _VARIABLES}
    cached = tempfile.tempdir
    os.environ.update(
        TMPDIR=str(own),
        SPARK_LOCAL_DIRS=str(own),
        SPARK_SUBMIT_OPTS=f"{before['SPARK_SUBMIT_OPTS'] or ''} -Djava.io.tmpdir={own}".strip(),
    )
    tempfile.tempdir = str(own)
    try:
        yield own
    finally:
        tempfile.tempdir = cached
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(own, ignore_errors=True)
        os.close(lock)
