"""The `streamtrain` command: broker, produce, run, dashboards, data.

A :class:`StreamtrainError` becomes one line on stderr and exit status 2; no traceback.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from pipeline import config
from pipeline.errors import ConfigError, StreamtrainError
from pipeline.observe.dashboard import DEFAULT_FILE as DASHBOARD_FILE
from producers import datasets

log = logging.getLogger("streamtrain")

_bootstrap_option = click.option(
    "--bootstrap", metavar="HOST:PORT",
    help="Use this Kafka instead of the embedded broker (env STREAMTRAIN_BOOTSTRAP).",
)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname).1s %(name)s: %(message)s", datefmt="%H:%M:%S", stream=sys.stderr,
    )
    # kafka-python logs every reconnect attempt at WARNING/ERROR; our own errors say it once.
    logging.getLogger("kafka").setLevel(logging.CRITICAL if not verbose else logging.INFO)
    logging.getLogger("py4j").setLevel(logging.WARNING if not verbose else logging.INFO)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def cli(verbose: bool) -> None:
    """Online training of Keras models from Kafka streams, distributed with Spark."""
    _setup_logging(verbose)


def _resolve_bootstrap(bootstrap: str | None) -> str:
    """--bootstrap, else $STREAMTRAIN_BOOTSTRAP, else a running `streamtrain broker`."""
    from pipeline.ingest.kafka import broker, client

    chosen = bootstrap or config.settings().bootstrap or broker.running_bootstrap()
    if not chosen:
        raise ConfigError(
            "No Kafka to send to: no --bootstrap, no STREAMTRAIN_BOOTSTRAP and no running embedded broker. "
            "Start one with `streamtrain broker` in another terminal, or pass --bootstrap HOST:PORT."
        )
    return client.parse_bootstrap(chosen)


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=9092, show_default=True, help="Port to listen on (0: a free port).")
@click.option("--engine", type=click.Choice(["tansu", "noida"]),
              help="tansu (default; env STREAMTRAIN_BROKER_ENGINE): memory only. noida: keeps its data "
                   "in --storage across restarts, and serves librdkafka before 2.1 (kcat).")
@click.option("--storage", metavar="URL|FOLDER",
              help="tansu: its storage engine URL (default memory://tansu/). noida: the folder that keeps "
                   "the data across restarts (default: a temporary folder, removed at exit); stopped with "
                   "Ctrl-C or SIGTERM it saves every record it acknowledged, and a restart on the same --port "
                   "and --storage carries on where it stopped (a SIGKILL can lose the last ~0.1 s).")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), help="Write the broker's own log here.")
def broker(host: str, port: int, engine: str | None, storage: str | None, log_path: str | None) -> None:
    """Run the embedded Kafka broker until Ctrl-C.

    Two engines speak the Kafka protocol here; each serves kafka-python, confluent-kafka
    and Spark's source, and only noida serves kcat (README: Brokers).
    """
    from pipeline.ingest.kafka import broker as broker_mod

    b = broker_mod.EmbeddedBroker(host=host, port=port, engine=engine, storage=storage, log_path=log_path).start()
    state = broker_mod.write_state(b)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    click.echo(f"embedded Kafka broker ({b.engine}, pid {b.pid}) at {b.bootstrap}; Ctrl-C stops it", err=True)
    click.echo(b.bootstrap)
    try:
        while not stop.wait(0.5):
            if not b.alive:
                raise StreamtrainError(f"The embedded broker exited unexpectedly (see --log {log_path or 'FILE'}).")
    except KeyboardInterrupt:
        pass
    finally:
        b.stop()
        broker_mod.clear_state()
        log.info("broker stopped; %s removed", state)


def _dataset(name: str, path: str | None, data_dir: str | None, **options: Any) -> Any:
    kwargs = {k: v for k, v in options.items() if v is not None}
    if name in datasets.BUILTIN:
        kwargs["data_dir"] = Path(data_dir) if data_dir else config.data_dir()
    return datasets.get(name, path, **kwargs)


@cli.command()
@click.argument("dataset", type=click.Choice(list(datasets.NAMES)))
@click.argument("path", required=False, type=click.Path())
@click.option("--topic", help="Kafka topic (default: the dataset's name).")
@click.option("--rate", type=float, help="Records per second (default: full speed).")
@click.option("--loop", is_flag=True, help="Start over at the end of the data, until --limit or Ctrl-C.")
@click.option("--limit", type=int, help="Stop after this many records.")
@click.option("--epochs", type=int, help="Stop after this many passes over the data (implies --loop).")
@click.option("--split", type=click.Choice(["train", "test"]), default="train", show_default=True)
@click.option("--partitions", type=int, default=2, show_default=True, help="Partitions of a new topic.")
@_bootstrap_option
@click.option("--metrics-port", type=int, help="Port of this producer's /metrics (0: a free port).")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Folder holding the datasets.")
@click.option("--label-column", help="csv: the label column (default: label).")
@click.option("--test-path", type=click.Path(), help="csv/higgs: a separate test file.")
@click.option("--num-classes", type=int, help="csv/npz: labels outside [0, N) count as malformed.")
@click.option("--max-malformed", type=float, metavar="N|FRACTION",
              help="Fail once more rows than this are malformed: a count, or a fraction below 1 (0.05: 5%).")
@click.option("--resume", is_flag=True,
              help="Continue a replay that was stopped or killed: skip the records of this replay's order that "
                   "the topic holds already (a topic only this replay writes to), so none is sent twice.")
@click.option("--progress/--no-progress", default=None, help="Progress bar (default: on a terminal).")
def produce(dataset: str, path: str | None, **options: Any) -> None:
    """Replay DATASET (from PATH, or the data folder) into a Kafka topic."""
    from pipeline.cluster.processes import stop_on_signals
    from producers import replay

    with stop_on_signals(threading.Event()) as stop:  # Ctrl-C from here on: flush and report
        report = _produce(replay, stop, dataset, path, **options)
    click.echo(report.summary())
    if report.interrupted:
        sys.exit(130)
    if report.send_errors:
        sys.exit(1)


def _produce(
    replay: Any, stop: threading.Event, dataset: str, path: str | None, *, topic: str | None, rate: float | None,
    loop: bool, limit: int | None, epochs: int | None, split: str, partitions: int, bootstrap: str | None,
    metrics_port: int | None, data_dir: str | None, label_column: str | None, test_path: str | None,
    num_classes: int | None, max_malformed: float | None, progress: bool | None, resume: bool,
) -> Any:
    given = {"label_column": label_column, "test_path": test_path, "num_classes": num_classes}
    takes = datasets.options(dataset)
    misplaced = [k for k, v in given.items() if v is not None and k not in takes]
    if misplaced:
        flags = ", ".join("--" + k.replace("_", "-") for k in misplaced)
        raise ConfigError(f"{flags} does not apply to {dataset}; it takes only: "
                          f"{', '.join('--' + k.replace('_', '-') for k in takes) or 'PATH'}.")
    data = _dataset(dataset, path, data_dir, **{k: v for k, v in given.items() if k in takes})
    target = _resolve_bootstrap(bootstrap)
    settings = config.settings()
    return replay.replay_with_metrics(
        data, metrics_host=settings.metrics_host,
        metrics_port=settings.producer_metrics_port if metrics_port is None else metrics_port,
        bootstrap=target, topic=topic or dataset, rate=rate, loop=loop, limit=limit, epochs=epochs, split=split,
        partitions=partitions, progress=sys.stderr.isatty() if progress is None else progress,
        max_malformed=max_malformed, stop=stop, resume=resume,
    )


@cli.command()
@click.option("--dataset", type=click.Choice(list(datasets.BUILTIN)), default="mnist", show_default=True,
              help="A built-in dataset, read from the data folder.")
@click.option("--algorithm", default="sync", show_default=True,
              help="sync, single, averaging, downpour, agn, adag, aeasgd, eamsgd or dynsgd.")
@click.option("--workers", type=int, default=2, show_default=True, help="Parallel model replicas.")
@click.option("--batch-size", type=int, default=128, show_default=True,
              help="Records per mini-batch on each worker; for sync, per round, split among the workers.")
@click.option("--window", "communication_window", type=int,
              help="Mini-batches between exchanges with the parameter server (default: the algorithm's own; "
                   "1 for sync, 5 for most asynchronous ones).")
@click.option("--epochs", type=int, default=1, show_default=True, help="Times the producer replays the data.")
@click.option("--rate", type=float, help="Replay rate, records/s (default: full speed).")
@click.option("--until-accuracy", type=float, help="Stop once held-out accuracy reaches this.")
@click.option("--max-batches", type=int, help="Stop after this many micro-batches.")
@click.option("--timeout", "timeout_s", type=float, help="Stop after this many seconds of streaming.")
@_bootstrap_option
@click.option("--broker-engine", type=click.Choice(["tansu", "noida"]),
              help="The embedded broker, when there is no --bootstrap (env STREAMTRAIN_BROKER_ENGINE; "
                   "default tansu). README: Brokers.")
@click.option("--topic", help="Train from this topic; with --bootstrap, fed by someone else (no replay).")
@click.option("--master", default="local[*]", show_default=True, envvar="STREAMTRAIN_MASTER",
              help="Spark master URL: local[N] or local[N,MAX_FAILURES], or spark://HOST:PORT (env "
                   "STREAMTRAIN_MASTER; README: When one machine is not enough).")
@click.option("--spark-conf", type=click.Path(dir_okay=False), envvar="STREAMTRAIN_SPARK_CONF",
              help="A Spark properties file for the session (a cluster beyond loopback needs one with "
                   "authentication and encryption: see streamtrain cluster-conf).")
@click.option("--model", help="Your model: FILE.py:BUILD_FN or FILE.keras (default: the dataset's).")
@click.option("--out", type=click.Path(file_okay=False), help="Output folder (default: runs/DATASET-TIME).")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False),
              help="Continue the run in this folder after a stop or crash.")
@click.option("--resume-if-exists", is_flag=True,
              help="With --out: continue the run there if it has a checkpoint, else start it (for services "
                   "that a supervisor restarts).")
@click.option("--serve-port", type=int, metavar="PORT",
              help="Serve predictions from the live weights here while training (TensorFlow Serving's REST "
                   "API: POST /v1/models/DATASET:predict; 0: a free port). README: Serving.")
@click.option("--serve-max-age", "serve_max_age_s", type=float, default=1.0, show_default=True,
              help="Seconds: never predict with weights older than this.")
@click.option("--max-offsets-per-trigger", type=int, default=20_000, show_default=True,
              help="Records per micro-batch at most.")
@click.option("--eval-every", type=int, default=5, show_default=True,
              help="Score the held-out split every this many micro-batches (and at the end).")
@click.option("--metrics-port", type=int, default=0, show_default=True, help="Port of /metrics (0: a free port).")
@click.option("--producer-metrics-port", type=int, default=0, show_default=True,
              help="Port of the replay producer's /metrics (0: a free port).")
@click.option("--data-dir", type=click.Path(file_okay=False), help="Folder holding the datasets.")
@click.option("--seed", type=int, help="Seed for reproducible data order.")
def run(resume_dir: str | None, out: str | None, bootstrap: str | None, resume_if_exists: bool,
        **options: Any) -> None:
    """The main job: replay a dataset into Kafka and train a model online from the stream."""
    from pipeline.jobs import online
    from pipeline.train import checkpoint

    if resume_dir and out and Path(out).resolve() != Path(resume_dir).resolve():
        raise ConfigError("Pass either --out or --resume (the folder to continue), not two folders.")
    if resume_if_exists:
        if not out:
            raise ConfigError("--resume-if-exists needs --out, the folder to continue or start.")
        if (Path(out) / checkpoint.FILENAME).exists():
            resume_dir = out
    boot = bootstrap or config.settings().bootstrap
    cfg = online.RunConfig(out=resume_dir or out, resume=bool(resume_dir), bootstrap=boot, **options)
    report = online.run(cfg)
    click.echo(report.summary())
    click.echo(f"model and report in {report.out}")


@cli.command("spark-master")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address (or name) to bind and advertise.")
@click.option("--port", default=7077, show_default=True)
@click.option("--webui-port", type=int, default=8080, show_default=True, help="Spark's web UI (0: a free port).")
@click.option("--properties-file", type=click.Path(dir_okay=False),
              help="The cluster's Spark properties (streamtrain cluster-conf); required beyond loopback.")
def spark_master(host: str, port: int, webui_port: int, properties_file: str | None) -> None:
    """Run Spark's standalone master in the foreground (Spark's own, from the pyspark wheel)."""
    from pipeline.cluster import standalone

    standalone.exec_(standalone.command("master", host=host, port=port, properties=properties_file,
                                        webui_port=webui_port), host)


@cli.command("spark-worker")
@click.argument("master")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address (or name) to bind and advertise.")
@click.option("--port", default=0, show_default=True, help="The worker's RPC port (0: a free one).")
@click.option("--cores", type=int, help="Cores for executors (default: all).")
@click.option("--memory", help="Memory for executors, e.g. 4g (default: all but 1 GB).")
@click.option("--work-dir", type=click.Path(file_okay=False), help="Executors' folders and logs.")
@click.option("--webui-port", type=int, default=8081, show_default=True, help="Spark's web UI (0: a free port).")
@click.option("--properties-file", type=click.Path(dir_okay=False),
              help="The cluster's Spark properties (streamtrain cluster-conf); required beyond loopback.")
def spark_worker(master: str, host: str, port: int, cores: int | None, memory: str | None, work_dir: str | None,
                 webui_port: int, properties_file: str | None) -> None:
    """Run a Spark standalone worker for MASTER (spark://HOST:PORT) in the foreground."""
    from pipeline.cluster import standalone

    standalone.exec_(standalone.command("worker", host=host, port=port, properties=properties_file, master=master,
                                        cores=cores, memory=memory, work_dir=work_dir, webui_port=webui_port), host)


@cli.command("cluster-conf")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--keep", is_flag=True, help="Leave an existing file as it is (for a deployment's first start).")
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
    click.echo(f"wrote {security.write_conf(path)}: start the master and workers with --properties-file {path}, "
               f"and pass --spark-conf {path} to streamtrain run")


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--port", default=8501, show_default=True, help="Port to listen on (0: a free one).")
@click.option("--name", help="The model's name in the URLs (default: the run's dataset).")
@click.option("--max-age", "max_age_s", type=float,
              help="Refuse to predict with a checkpoint older than this many seconds (default: any age).")
def serve(run_dir: str, port: int, name: str | None, max_age_s: float | None) -> None:
    """Serve the model of RUN_DIR over TensorFlow Serving's REST API until Ctrl-C.

    The weights are the run's checkpoint, reloaded whenever the run (still training, or
    resumed) writes a new one. Listens on STREAMTRAIN_SERVE_HOST (loopback by default); with
    STREAMTRAIN_SERVE_TOKEN set, requests need "Authorization: Bearer <token>".
    """
    from pipeline.serve import process
    from pipeline.train import checkpoint

    folder = Path(run_dir)
    if not (folder / checkpoint.FILENAME).is_file():
        raise ConfigError(f"Expected a run folder with a checkpoint ({checkpoint.FILENAME}). Received: {run_dir}; "
                          "pass the --out folder of a run that trained at least one micro-batch.")
    process.check_serving(port, max_age_s)
    host, token = process.host_and_token()
    process.serve_folder(folder, host=host, port=port, name=name, token=token, max_age_s=max_age_s)


@cli.command()
@click.option("--run", "run_dir", required=True, type=click.Path(file_okay=False),
              help="The run whose model scores (its checkpoint, reloaded as the run writes new ones).")
@click.option("--topic", required=True, help="The topic of records to score.")
@click.option("--output-topic", help="Where predictions go (default: TOPIC.predictions).")
@click.option("--input-format", type=click.Choice(["wire", "json"]), default="wire", show_default=True,
              help="wire: records as `streamtrain produce` writes them; json: each value one JSON instance "
                   '(a list of numbers, or {"instances": [one]}) in the same units.')
@_bootstrap_option
@click.option("--checkpoint", type=click.Path(file_okay=False),
              help="The query's checkpoint: a restart continues after it (default: RUN/predict-TOPIC).")
@click.option("--available-now", is_flag=True, help="Score what the topic holds now, then stop.")
@click.option("--max-batches", type=int, help="Stop after this many micro-batches.")
@click.option("--timeout", "timeout_s", type=float, help="Stop after this many seconds.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--metrics-port", type=int, help="Serve /metrics here (0: a free port).")
def predict(bootstrap: str | None, **options: Any) -> None:
    """Score a topic's records with a run's model, writing one prediction per record, keyed
    like its input, with its source partition and offset and the weights' version."""
    from pipeline.jobs import predict as predict_job

    summary = predict_job.run(predict_job.PredictConfig(bootstrap=_resolve_bootstrap(bootstrap), **options))
    click.echo(summary.summary())


@cli.group()
def dashboards() -> None:
    """The Grafana dashboard: build its JSON, push it to Grafana, or render it without Grafana."""


@dashboards.command("build")
@click.option("--out", type=click.Path(dir_okay=False), default=str(DASHBOARD_FILE), show_default=True,
              help="Where to write the dashboard JSON.")
def dashboards_build(out: str) -> None:
    """Write the dashboard as Grafana JSON (what deploy/grafana provisions)."""
    from pipeline.observe import dashboard

    board = dashboard.build()
    dashboard.validate(board)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(board, indent=2, sort_keys=True) + "\n")
    click.echo(f"{len(dashboard.panels(board))} panels written to {out}")


@dashboards.command("push")
@click.option("--grafana-url", required=True,
              help="Grafana's URL, e.g. http://admin:admin@localhost:3000 (or a token in GRAFANA_TOKEN).")
@click.option("--prometheus-url", default="http://prometheus:9090", show_default=True,
              help="Prometheus as Grafana reaches it (the datasource's URL).")
@click.option("--dashboard", "dashboard_path", type=click.Path(dir_okay=False),
              help="A dashboard JSON file (default: the built-in dashboard).")
@click.option("--folder", default="streamtrain", show_default=True, help="Grafana folder uid and title.")
def dashboards_push(grafana_url: str, prometheus_url: str, dashboard_path: str | None, folder: str) -> None:
    """Upload the Prometheus datasource and the dashboard to Grafana with grafana-client."""
    from pipeline.observe import dashboard

    board = dashboard.load(dashboard_path)
    url = dashboard.push(grafana_url, prometheus_url, token=_grafana_token(),
                         dashboard=board, folder=folder)
    click.echo(f"datasource {dashboard.DATASOURCE_UID} and dashboard uploaded: {url}")


def _grafana_token() -> str | None:
    token = config.settings().grafana_token
    return token.get_secret_value() if token else None


@dashboards.command("render")
@click.option("--prometheus", "prometheus_url", default="http://127.0.0.1:9090", show_default=True,
              help="Prometheus that scraped the run.")
@click.option("--out", type=click.Path(dir_okay=False), default="panels.png", show_default=True,
              help="The PNG to write.")
@click.option("--since", default="30m", show_default=True, help="How far back to draw: 90s, 30m, 2h, 1d.")
@click.option("--dashboard", "dashboard_path", type=click.Path(dir_okay=False),
              help="A dashboard JSON file (default: the built-in dashboard).")
@click.option("--scrape-interval", default="5s", show_default=True,
              help="Prometheus's scrape interval (sets the rate window as Grafana would).")
def dashboards_render(prometheus_url: str, out: str, since: str, dashboard_path: str | None,
                      scrape_interval: str) -> None:
    """Draw the dashboard's panels from Prometheus data into a PNG, for people without Grafana."""
    from pipeline.observe import dashboard, render

    found = render.render(dashboard.load(dashboard_path), prometheus_url, out, since_s=render.parse_duration(since),
                          scrape_s=render.parse_duration(scrape_interval))
    empty = [title for title, n in found.items() if not n]
    click.echo(f"{len(found)} panels drawn to {out}" + (f"; no data for: {', '.join(empty)}" if empty else ""))


@cli.group()
def data() -> None:
    """Datasets: fetch them where there is internet."""


@data.command("fetch")
@click.argument("dataset", type=click.Choice(["mnist", "higgs"]))
@click.option("--data-dir", type=click.Path(file_okay=False), help="Where to put HIGGS (default: the data folder).")
def data_fetch(dataset: str, data_dir: str | None) -> None:
    """Download DATASET once (MNIST into the cache, HIGGS.csv.gz into the data folder)."""
    if dataset == "mnist":
        from producers.datasets import mnist

        click.echo(mnist.fetch())
    else:
        from producers.datasets import higgs

        click.echo(higgs.fetch(Path(data_dir) if data_dir else None))


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning streamtrain errors into one line and exit 2."""
    try:
        cli.main(args=argv, prog_name="streamtrain", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except StreamtrainError as e:
        click.echo(f"streamtrain: error: {e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
