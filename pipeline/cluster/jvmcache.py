"""An archive of the classes Spark's driver JVM loads (AppCDS), so that start-up is shorter.

Spark's driver loads some 15,000 classes before the first micro-batch. Mapped from an
archive, the session starts ~3 s sooner and the first query ~2 s sooner on 2 cores. The
first run records which classes it loads (no measurable cost); when it ends, a
background process at the lowest CPU priority builds the archive from that list
(~30 s of CPU, once), and later runs map it. The archive (~170 MB, in the cache folder)
belongs to one Java and one Spark; the JVM checks it, checksums included, and starts
without it when it does not match. ``STREAMTRAIN_JVM_CLASS_CACHE=false`` turns it off.

    python -m pipeline.cluster.jvmcache CLASSLIST ARCHIVE JAVA ARGFILE   # what a run starts
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pipeline import config
from pipeline.errors import ConfigError

log = logging.getLogger(__name__)

#: (class list, archive) while this process's JVM records the classes it loads.
_recording: tuple[Path, Path] | None = None


def options() -> list[str]:
    """Options for a driver JVM about to start: map the archive, or record a class list."""
    global _recording
    java = java_binary()
    if not config.settings().jvm_class_cache or java is None:
        return []
    archive = archive_path(java)
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}", "-XX:+VerifySharedSpaces"]
    try:
        archive.parent.mkdir(parents=True, exist_ok=True)
        for old in archive.parent.glob("*.part"):  # left by runs that were killed
            if time.time() - old.stat().st_mtime > 3600:
                old.unlink(missing_ok=True)
    except OSError as e:
        log.debug("no class archive: %s", e)
        return []
    classlist = archive.with_name(f"{archive.name}.{os.getpid()}.classlist.part")
    _recording = (classlist, archive)
    return [f"-XX:DumpLoadedClassList={classlist}"]


def recording() -> bool:
    """Whether this process's JVM is recording the classes it loads."""
    return _recording is not None


def after_stop(gateway: object) -> None:
    """After the Spark session stops: if its JVM recorded a class list, let the JVM exit
    (so the list is complete) and start building the archive in the background."""
    global _recording
    if _recording is None:
        return
    (classlist, archive), _recording = _recording, None
    proc = getattr(gateway, "proc", None)
    jvm = getattr(gateway, "jvm", None)
    if proc is None or proc.stdin is None or jvm is None:
        return
    classpath = str(jvm.java.lang.System.getProperty("java.class.path"))
    java = java_binary()
    gateway.shutdown()  # type: ignore[attr-defined]
    proc.stdin.close()  # the JVM exits at the end of its input
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        return
    if java is None or not classlist.is_file():
        return
    argfile = classlist.with_name(classlist.name.replace(".classlist.", ".args."))
    argfile.write_text(f'-cp "{classpath}"\n')
    with open(archive.with_suffix(".log"), "a") as out:
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipeline.cluster.jvmcache",
                str(classlist),
                str(archive),
                java,
                str(argfile),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    log.info(
        "building Spark's class archive in the background, so that later runs start sooner (once)"
    )


def build(classlist: Path, archive: Path, java: str, argfile: Path) -> int:
    """Build ``archive`` from ``classlist`` (the exit status of ``java -Xshare:dump``).

    Only a complete archive is put in place, by an atomic rename (a new file, never one
    rewritten in place): a JVM that has the archive mapped dies with SIGBUS if the file
    shrinks under it. A JVM that starts on a short or damaged archive refuses it.
    """
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.part")
    try:
        with open(archive.with_suffix(".lock"), "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0  # another run is building it
            if archive.is_file():
                return 0
            done = subprocess.run(
                [
                    java,
                    "-Xshare:dump",
                    f"-XX:SharedClassListFile={classlist}",
                    f"-XX:SharedArchiveFile={partial}",
                    "-XX:+VerifySharedSpaces",
                    f"@{argfile}",
                ],
                stdin=subprocess.DEVNULL,
                check=False,
            )
            if done.returncode == 0 and partial.is_file() and partial.stat().st_size:
                os.replace(partial, archive)
            return done.returncode
    finally:
        for leftover in (partial, classlist, argfile):
            with contextlib.suppress(OSError):
                leftover.unlink()


def archive_path(java: str) -> Path:
    """Where the archive for this ``java`` and this Spark lives."""
    import pyspark

    spark_home = Path(config.settings().spark_home or Path(pyspark.__file__).parent).resolve()
    key = hashlib.sha256(
        f"{pyspark.__version__}\0{spark_home}\0{java}\0{os.stat(java).st_mtime_ns}".encode()
    ).hexdigest()[:16]
    return config.cache_dir() / "jvm" / f"spark-{pyspark.__version__}-{key}.jsa"


def check_java() -> None:
    """Refuse, in one line, a Java that Spark's launcher cannot start (a wrong ``JAVA_HOME``,
    or none on PATH): Spark itself ends in a long ``JAVA_GATEWAY_EXITED`` traceback."""
    if java_binary() is not None:
        return
    home = config.settings().java_home
    if home is not None:
        raise ConfigError(
            f"Expected a Java for Spark at $JAVA_HOME/bin/java. Received: JAVA_HOME={home}, which "
            "has none; set JAVA_HOME to a JDK's folder (Java 17 or later), or unset it to use "
            "the java on PATH."
        )
    raise ConfigError(
        "Expected a Java for Spark (Java 17 or later). Received: no JAVA_HOME and no java on PATH; "
        "install one (apt-get install openjdk-17-jre-headless) or set JAVA_HOME."
    )


def java_binary() -> str | None:
    """The java Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = config.settings().java_home
    found = str(home / "bin" / "java") if home else shutil.which("java")
    return (
        os.path.realpath(found)
        if found and os.path.isfile(found) and os.access(found, os.X_OK)
        else None
    )


if __name__ == "__main__":
    os.nice(19)  # only idle CPU: a run or a benchmark that starts meanwhile keeps the cores
    classlist_arg, archive_arg, java_arg, argfile_arg = sys.argv[1:5]
    sys.exit(build(Path(classlist_arg), Path(archive_arg), java_arg, Path(argfile_arg)))
