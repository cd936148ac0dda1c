"""Java libraries from Maven Central, resolved once into streamtrain's cache.

Apache Kafka's broker (``streamtrain broker --engine kafka``) and Spark's own Kafka source
(``--source jvm``) are jars that the pip install does not bring. They are resolved the way
``spark.jars.packages`` resolves them: by the Apache Ivy that pyspark ships
(``pyspark/jars/ivy-*.jar``), run as its own command line, so a user's machine needs Java
and a route to Maven Central, nothing more. A set of jars lands in
``<cache>/jars/<name>/`` with a ``complete`` mark written last, so an interrupted resolution
is redone, not half used. ``$STREAMTRAIN_MAVEN_REPO`` names a mirror instead of Maven Central.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from xml.sax.saxutils import quoteattr

from pipeline import config
from pipeline.cluster import jvmcache
from pipeline.errors import ConfigError

#: The mark written once every jar of a set is in place.
COMPLETE = "complete"


def ivy_jar() -> Path:
    """The Ivy jar inside the installed pyspark (what ``spark.jars.packages`` runs)."""
    import pyspark

    found = sorted(glob.glob(str(Path(pyspark.__file__).parent / "jars" / "ivy-*.jar")))
    if not found:
        raise ConfigError(
            "Expected Apache Ivy inside pyspark (pyspark/jars/ivy-*.jar) to resolve Java "
            "libraries. Received: none. Reinstall pyspark (`pip install --force-reinstall "
            "pyspark`)."
        )
    return Path(found[-1])


def _ivy_module(coordinates: Sequence[str]) -> str:
    """An ivy.xml that asks for each ``group:artifact:version`` with its dependencies.

    Example:
        >>> "name=\\"kafka_2.13\\"" in _ivy_module(["org.apache.kafka:kafka_2.13:4.4.0"])
        True
    """
    deps = []
    for coordinate in coordinates:
        group, artifact, version = coordinate.split(":")
        deps.append(
            f"    <dependency org={quoteattr(group)} name={quoteattr(artifact)} "
            f'rev={quoteattr(version)} conf="default->default(*),master(*)"/>'
        )
    return (
        '<ivy-module version="2.0">\n'
        '  <info organisation="streamtrain" module="resolve"/>\n'
        '  <configurations><conf name="default"/></configurations>\n'
        "  <dependencies>\n" + "\n".join(deps) + "\n  </dependencies>\n</ivy-module>\n"
    )


def _ivy_settings(repo: str) -> str:
    """Ivy settings with one Maven repository (Maven Central unless a mirror is named)."""
    return (
        "<ivysettings>\n"
        '  <settings defaultResolver="central"/>\n'
        "  <resolvers>\n"
        f'    <ibiblio name="central" m2compatible="true" root={quoteattr(repo)}/>\n'
        "  </resolvers>\n"
        "</ivysettings>\n"
    )


def folder(name: str, coordinates: Sequence[str]) -> Path:
    """Where the set ``name`` of ``coordinates`` lives in the cache."""
    digest = hashlib.sha256("\n".join(sorted(coordinates)).encode()).hexdigest()[:10]
    return config.cache_dir() / "jars" / f"{name}-{digest}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One resolution per set at a time: test workers and a run may ask at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def resolve(
    name: str,
    coordinates: Sequence[str],
    *,
    what: str,
    repo: str | None = None,
    timeout_s: float = 600.0,
    quiet: bool = True,
) -> list[Path]:
    """The jars of ``coordinates`` and everything they depend on, from the cache or Maven.

    Args:
        name: the set's name in the cache (``kafka``, ``spark-sql-kafka``).
        coordinates: ``group:artifact:version`` of each library asked for.
        what: what needs them, for the error line (``Apache Kafka's broker``).
        repo: the Maven repository (default ``$STREAMTRAIN_MAVEN_REPO``, else Maven Central).
        timeout_s: how long a resolution may take before it is given up.
        quiet: say nothing; else one line on stderr when a resolution starts (Ivy's own
            output always goes to a log in the set's folder).

    Raises:
        ConfigError: Java is missing, or Maven Central (or the mirror) cannot be reached.
    """
    target = folder(name, coordinates)
    if (target / COMPLETE).is_file():
        return sorted(target.glob("*.jar"))
    repo = repo or config.settings().maven_repo
    java = jvmcache.java_binary()
    if java is None:
        raise ConfigError(
            f"Expected Java 17 or newer for {what}. Received: no `java` on PATH and no "
            "JAVA_HOME. Install a JDK (Debian: apt-get install openjdk-17-jre-headless)."
        )
    with _locked(target.with_name(target.name + ".lock")):
        if (target / COMPLETE).is_file():  # another process resolved it while we waited
            return sorted(target.glob("*.jar"))
        if not quiet:
            print(
                f"resolving {what} ({', '.join(coordinates)}) from {repo}, once ...",
                file=sys.stderr,
                flush=True,
            )
        work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        try:
            _retrieve(work, coordinates, repo=repo, java=java, what=what, timeout_s=timeout_s)
            shutil.rmtree(target, ignore_errors=True)
            (work / "lib").rename(target)
            shutil.move(str(work / "ivy.log"), target / "ivy.log")
        finally:
            shutil.rmtree(work, ignore_errors=True)  # a failed or interrupted try leaves nothing
        (target / COMPLETE).write_text("\n".join(coordinates) + "\n")
    return sorted(target.glob("*.jar"))


def _retrieve(
    work: Path, coordinates: Sequence[str], *, repo: str, java: str, what: str, timeout_s: float
) -> None:
    """Run Ivy in ``work``: the jars into ``work/lib``, its output into ``work/ivy.log``."""
    (work / "ivy.xml").write_text(_ivy_module(coordinates))
    (work / "ivysettings.xml").write_text(_ivy_settings(repo))
    log = work / "ivy.log"
    try:
        with open(log, "wb") as out:
            done = subprocess.run(
                [
                    java,
                    "-jar",
                    str(ivy_jar()),
                    "-settings",
                    str(work / "ivysettings.xml"),
                    "-ivy",
                    str(work / "ivy.xml"),
                    "-confs",
                    "default",
                    # Ivy's own download cache, shared by every set: a second set that needs
                    # the same jars (kafka-clients) copies them, not downloads.
                    "-cache",
                    str(config.cache_dir() / "ivy"),
                    "-retrieve",
                    str(work / "lib" / "[artifact]-[revision](-[classifier]).[ext]"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            )
    except subprocess.TimeoutExpired:
        raise ConfigError(
            f"Expected {what}'s jars from {repo} within {timeout_s:.0f} s. Received: no "
            "answer. Check the network (or set STREAMTRAIN_MAVEN_REPO to a reachable "
            "mirror) and try again."
        ) from None
    if done.returncode != 0 or not list((work / "lib").glob("*.jar")):
        raise ConfigError(
            f"Expected {what}'s jars ({', '.join(coordinates)}) from {repo}. Received: "
            f"{_first_error(log)}. Check the network (or set STREAMTRAIN_MAVEN_REPO to a "
            "reachable mirror) and try again."
        )


def _first_error(log: Path) -> str:
    r"""What Ivy's output says failed: the server it could not reach, else what was not found.

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        ...     _ = f.write("\t\t:: org.apache.kafka#kafka_2.13;9.9.9: not found\n")
        >>> _first_error(Path(f.name))
        'org.apache.kafka#kafka_2.13;9.9.9: not found'
    """
    try:
        lines = [line.strip(" \t:") for line in log.read_text(errors="replace").splitlines()]
    except OSError:
        return "Ivy failed without a log"
    unreachable = [line for line in lines if line.startswith("Server access error")]
    if unreachable:
        cause = unreachable[0].rsplit("(", 1)[-1].rstrip(")")
        url = unreachable[0].split(" at url ", 1)[-1].split(" ", 1)[0]
        return f"{cause} at {url}"
    missing = [line for line in lines if line.endswith(": not found")]
    if missing:
        return "; ".join(missing[:3])
    return (next((line for line in reversed(lines) if line), "Ivy failed without output"))[:300]
