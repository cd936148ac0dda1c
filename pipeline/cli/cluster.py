"""`streamtrain spark-master`, `spark-worker`, `cluster-conf` and `secrets`: a Spark standalone
cluster, and a deployment's generated secrets."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.cli.base import cli
from pipeline.errors import ConfigError

#: The web UIs have no login: they list the applications and serve executors' logs.
_WEBUI_HOST = (
    "Address the web UI binds (loopback by default: it has no login and serves executors' logs; "
    "reach it through an SSH tunnel)."
)


@cli.command("spark-master")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address (or name) to bind and advertise.",
)
@click.option("--port", default=7077, show_default=True)
@click.option(
    "--webui-port",
    type=int,
    default=8080,
    show_default=True,
    help="Spark's web UI (0: a free port).",
)
@click.option("--webui-host", default="127.0.0.1", show_default=True, help=_WEBUI_HOST)
@click.option(
    "--properties-file",
    type=click.Path(dir_okay=False),
    help="The cluster's Spark properties (streamtrain cluster-conf); required beyond loopback.",
)
def spark_master(
    host: str, port: int, webui_port: int, webui_host: str, properties_file: str | None
) -> None:
    """Run Spark's standalone master in the foreground (Spark's own, from the pyspark wheel);
    it prints "spark master ready at spark://HOST:PORT" once it leads."""
    from pipeline.cluster import standalone

    standalone.exec_(
        standalone.command(
            "master", host=host, port=port, properties=properties_file, webui_port=webui_port
        ),
        host,
        webui_host=webui_host,
    )


@cli.command("spark-worker")
@click.argument("master")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address (or name) to bind and advertise.",
)
@click.option("--port", default=0, show_default=True, help="The worker's RPC port (0: a free one).")
@click.option("--cores", type=int, help="Cores for executors (default: all).")
@click.option("--memory", help="Memory for executors, e.g. 4g (default: all but 1 GB).")
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False),
    help="Executors' folders and logs (default: spark-work in the cache folder, "
    "~/.cache/streamtrain).",
)
@click.option(
    "--webui-port",
    type=int,
    default=8081,
    show_default=True,
    help="Spark's web UI (0: a free port).",
)
@click.option("--webui-host", default="127.0.0.1", show_default=True, help=_WEBUI_HOST)
@click.option(
    "--properties-file",
    type=click.Path(dir_okay=False),
    help="The cluster's Spark properties (streamtrain cluster-conf); required beyond loopback.",
)
def spark_worker(
    master: str,
    host: str,
    port: int,
    cores: int | None,
    memory: str | None,
    work_dir: str | None,
    webui_port: int,
    webui_host: str,
    properties_file: str | None,
) -> None:
    """Run a Spark standalone worker for MASTER (spark://HOST:PORT) in the foreground; it
    prints "spark worker ready at ..." with its cores once the master has registered it."""
    from pipeline.cluster import standalone

    args = standalone.command(
        "worker",
        host=host,
        port=port,
        properties=properties_file,
        master=master,
        cores=cores,
        memory=memory,
        work_dir=work_dir,
        webui_port=webui_port,
    )
    click.echo(
        f"executors' folders and logs in {standalone.worker_folder(work_dir)} (--work-dir)",
        err=True,
    )
    standalone.exec_(args, host, webui_host=webui_host)


@cli.command("cluster-status")
@click.argument("master")
@click.option(
    "--webui",
    help="The master's web UI (default: http://127.0.0.1:8080 on the master's machine, where "
    "it listens; elsewhere, an SSH tunnel's near end).",
)
def cluster_status(master: str, webui: str | None) -> None:
    """Say MASTER's state and its registered workers with their cores (from its web UI)."""
    from pipeline.cluster import status

    for line in status.describe(master, webui or status.webui_url(master)):
        click.echo(line)


@cli.command("cluster-conf")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option(
    "--keep", is_flag=True, help="Leave an existing file as it is (for a deployment's first start)."
)
def cluster_conf(path: str, keep: bool) -> None:
    """Write PATH: a Spark properties file with a fresh secret that turns on Spark's RPC
    authentication and encryption (mode 0600).

    Copy it to every machine of the cluster, start the master and the workers with
    `--properties-file PATH`, and train with `streamtrain run --master spark://HOST:7077
    --spark-conf PATH`.
    """
    from pipeline.cluster import security

    if keep and Path(path).is_file():
        click.echo(f"{path} exists: kept")
        return
    click.echo(
        f"wrote {security.write_conf(path)}: start the master and workers with --properties-file "
        f"{path}, and pass --spark-conf {path} to streamtrain run"
    )


@cli.command("secrets")
@click.option(
    "--spark-conf",
    type=click.Path(dir_okay=False),
    help="The cluster's Spark properties (mode 0600).",
)
@click.option(
    "--serve-token",
    type=click.Path(dir_okay=False),
    help="The model server's bearer token (mode 0600).",
)
@click.option(
    "--grafana-password",
    type=click.Path(dir_okay=False),
    help="Grafana's admin password (mode 0644: Grafana runs as another user; keep it in a volume "
    "only Grafana mounts).",
)
@click.option(
    "--kafka-broker",
    type=click.Path(file_okay=False),
    help="A secured Kafka broker's files: TLS certificate, SCRAM user, properties (mode 0644: the "
    "broker runs as another user; keep it in a volume only the broker mounts). With "
    "--kafka-client.",
)
@click.option(
    "--kafka-client",
    type=click.Path(dir_okay=False),
    help="The client properties file for --kafka-conf (mode 0600), and the CA's certificate "
    "beside it.",
)
def secrets_(
    spark_conf: str | None,
    serve_token: str | None,
    grafana_password: str | None,
    kafka_broker: str | None,
    kafka_client: str | None,
) -> None:
    """Generate a deployment's secrets on its first start; files already there are kept."""
    from pipeline.cluster import security
    from pipeline.ingest.kafka import credentials

    if bool(kafka_broker) != bool(kafka_client):
        raise ConfigError(
            "Expected --kafka-broker DIR and --kafka-client FILE together (the broker's "
            "credentials and the client's that match them)."
        )
    if kafka_broker and kafka_client:
        written = credentials.write(kafka_broker, kafka_client)
        click.echo(f"{kafka_broker}, {kafka_client}: {'written' if written else 'kept'}")

    if spark_conf:
        kept = Path(spark_conf).is_file()
        if not kept:
            security.write_conf(spark_conf)
        click.echo(f"{spark_conf}: {'kept' if kept else 'written'}")
    for path, mode in ((serve_token, 0o600), (grafana_password, 0o644)):
        if path:
            click.echo(f"{path}: {'written' if security.write_secret(path, mode=mode) else 'kept'}")
