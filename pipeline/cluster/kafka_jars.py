"""Spark's own Kafka source (``format("kafka")``, ``--source jvm``): the spark-sql-kafka jar of
the installed pyspark's version, resolved with its dependencies into streamtrain's cache
(:func:`pipeline.cluster.maven.resolve`) and put on the session's ``spark.jars``.

The pip install of pyspark does not carry it. Of the 13 jars Ivy resolves for it, most
(hadoop-client, scala-library, snappy, lz4, slf4j...) are already in pyspark's own ``jars``
folder: only the others go on the classpath, so no class is there twice. On a ``spark://``
cluster, ``spark.jars`` ships them to the executors as well.
"""

from __future__ import annotations

import glob
from pathlib import Path

from pipeline.cluster import maven

#: The set's name in the cache.
NAME = "spark-sql-kafka"
#: What needs the jars, for the error line.
WHAT = "Spark's own Kafka source (--source jvm)"


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def coordinates() -> list[str]:
    """The spark-sql-kafka artifact for the installed pyspark (its version and Scala's).

    >>> coordinates()[0].startswith("org.apache.spark:spark-sql-kafka-0-10_2.")
    True
    """
    import pyspark

    core = sorted(glob.glob(str(_pyspark_jars() / "spark-core_*.jar")))
    # spark-core_2.13-4.2.0.jar: the Scala version the connector must be built for.
    scala = Path(core[-1]).name.split("_")[1].split("-")[0] if core else "2.13"
    return [f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{pyspark.__version__}"]


def extra(jars: list[Path], present: set[str]) -> list[Path]:
    """The jars of ``jars`` whose file name is not among ``present`` (pyspark's own).

    >>> [p.name for p in extra([Path("a/x-1.jar"), Path("a/y-2.jar")], {"x-1.jar"})]
    ['y-2.jar']
    """
    return [j for j in jars if j.name not in present]


def jars() -> list[Path]:
    """The jars Spark's Kafka source needs beyond pyspark's own, as local paths, resolved
    from Maven Central (or the mirror) where the cache lacks them.

    Raises:
        ConfigError: they cannot be had (no Java, no route to Maven Central, a pyspark version
            whose connector Maven Central does not serve), in one line.
    """
    if glob.glob(str(_pyspark_jars() / "spark-sql-kafka-*.jar")):
        return []  # baked into pyspark's own folder (the Docker image): nothing to add
    resolved = maven.resolve(NAME, coordinates(), what=WHAT, quiet=False)
    present = {p.name for p in _pyspark_jars().glob("*.jar")}
    return extra(resolved, present)


def spark_conf(source: str | None, conf: dict[str, str] | None = None) -> dict[str, str]:
    """``conf`` with the source's jars added to ``spark.jars`` (after any already named there):
    for ``jvm``, resolved if needed; ``auto`` reads with the Python source, which needs none.

    >>> spark_conf("python", {"spark.app.name": "x"})
    {'spark.app.name': 'x'}
    """
    out = dict(conf or {})
    if source != "jvm":
        return out
    found = jars()
    if found:
        given = [j for j in out.get("spark.jars", "").split(",") if j]
        out["spark.jars"] = ",".join([*given, *(str(j) for j in found)])
    return out
