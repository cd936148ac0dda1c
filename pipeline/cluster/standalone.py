"""Spark's own standalone master and worker, started the way streamtrain's runs expect.

The pyspark wheel ships ``bin/spark-class`` but none of Spark's ``sbin/start-*.sh``; these
run ``spark-class`` in the foreground (a service manager or Compose supervises them), with
the cluster's properties file (``streamtrain cluster-conf``) read by the JVM itself, never
passed on its command line.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipeline import config
from pipeline.cluster import readiness, security
from pipeline.errors import ConfigError


def spark_home() -> Path:
    """``$SPARK_HOME``, else the pyspark wheel's folder."""
    import pyspark

    return Path(config.settings().spark_home or Path(pyspark.__file__).parent)


def worker_folder(work_dir: str | None) -> Path:
    """A worker's folder for its executors' files and logs: ``work_dir``, else
    ``<cache>/spark-work`` (Spark's own default is inside its home: the installed pyspark
    package)."""
    folder = Path(work_dir) if work_dir else config.cache_dir() / "spark-work"
    folder.mkdir(parents=True, exist_ok=True)
    return folder.resolve()


def command(
    role: str,
    *,
    host: str,
    port: int,
    properties: str | None,
    master: str | None = None,
    cores: int | None = None,
    memory: str | None = None,
    work_dir: str | None = None,
    webui_port: int | None = None,
) -> list[str]:
    """The ``spark-class`` command line of a master or a worker (``role``), after checking
    that a cluster beyond loopback authenticates and encrypts its RPC.

    >>> command("master", host="127.0.0.1", port=7077, properties=None)[
    ...     1:
    ... ]  # doctest: +NORMALIZE_WHITESPACE
    ['org.apache.spark.deploy.master.Master', '--host', '127.0.0.1', '--port', '7077',
    '--webui-port', '8080']
    """
    target = master or f"spark://{host}:{port}"
    if not security.on_loopback(f"spark://{host}:0") or not security.on_loopback(target):
        security.spark_conf(
            f"spark://{host}:{port}" if role == "master" else target,
            properties,
            option="--properties-file",
        )
    elif properties:
        security.read_properties(properties)
    args = [str(spark_home() / "bin" / "spark-class")]
    if role == "master":
        args += [
            "org.apache.spark.deploy.master.Master",
            "--host",
            host,
            "--port",
            str(port),
            "--webui-port",
            str(8080 if webui_port is None else webui_port),
        ]
    else:
        args += [
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            host,
            "--webui-port",
            str(8081 if webui_port is None else webui_port),
        ]
        args += ["--port", str(port)] if port else []
        args += ["--cores", str(cores)] if cores else []
        args += ["--memory", memory] if memory else []
        args += ["--work-dir", str(worker_folder(work_dir))]
    if properties:
        args += ["--properties-file", properties]
    return args + ([target] if role == "worker" else [])


#: Java options of every master: Spark's REST submission server (port 6066) ignores
#: ``spark.authenticate`` and would run any job sent to it. A system property wins over
#: the properties file, so no file turns it back on.
MASTER_OPTS = "-Dspark.master.rest.enabled=false"
#: Where Spark's web UIs listen unless ``--webui-host`` says otherwise: they have no login,
#: and serve the cluster's applications and every executor's stderr to whoever connects.
WEBUI_HOST = "127.0.0.1"


def exec_(args: list[str], host: str, *, webui_host: str = WEBUI_HOST) -> None:
    """Replace this process with ``args`` (the pid stays: a supervisor stops the JVM by it),
    Spark's RPC binding and advertising ``host``, its web UI bound to ``webui_host``; a
    master without its REST submission server. A watcher (this process's child) relays the
    JVM's log and says "ready at ..." when the master leads or the worker has registered."""
    import socket

    env = {**os.environ, "SPARK_HOME": str(spark_home())}
    if "org.apache.spark.deploy.master.Master" in args:
        env["SPARK_MASTER_OPTS"] = f"{env.get('SPARK_MASTER_OPTS', '')} {MASTER_OPTS}".strip()
    env.setdefault("SPARK_LOCAL_HOSTNAME", host)
    try:
        socket.gethostbyname(host)
    except OSError:
        raise ConfigError(
            f"Expected --host to be this machine's address or a name for it. Received: {host!r} "
            "(it does not resolve)."
        ) from None
    # The master's and the workers' RPC bind --host; their web UIs bind SPARK_LOCAL_IP alone.
    env["SPARK_LOCAL_IP"] = webui_host
    readiness.watch_stderr(
        "master" if "org.apache.spark.deploy.master.Master" in args else "worker"
    )
    os.execve(args[0], args, env)
