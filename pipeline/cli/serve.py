"""`streamtrain serve` (a run's model over HTTP) and `streamtrain predict` (a topic scored)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline import config
from pipeline.cli.base import (
    bootstrap_option,
    cli,
    kafka_conf_option,
    resolve_bootstrap,
    resolve_kafka_conf,
)
from pipeline.errors import ConfigError


@cli.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--port", default=8501, show_default=True, help="Port to listen on (0: a free one).")
@click.option("--name", help="The model's name in the URLs (default: the run's dataset).")
@click.option(
    "--max-age",
    "max_age_s",
    type=float,
    help="Refuse to predict with a checkpoint older than this many seconds (default: any age).",
)
def serve(run_dir: str, port: int, name: str | None, max_age_s: float | None) -> None:
    """Serve the model of RUN_DIR over TensorFlow Serving's REST API until Ctrl-C.

    The weights are the run's checkpoint, reloaded whenever the run (still training, or
    resumed) writes a new one. Listens on STREAMTRAIN_SERVE_HOST (loopback by default); with
    STREAMTRAIN_SERVE_TOKEN set, requests need "Authorization: Bearer <token>".
    """
    from pipeline.cluster import scratch
    from pipeline.serve import process
    from pipeline.train import checkpoint

    folder = Path(run_dir)
    if not (folder / checkpoint.FILENAME).is_file():
        raise ConfigError(
            f"Expected a run folder with a checkpoint ({checkpoint.FILENAME}). Received: "
            f"{run_dir}; pass the --out folder of a run that trained at least one micro-batch."
        )
    host, token = process.host_and_token(config.settings())
    process.check_serving(port, max_age_s, host=host)
    with scratch.scratch():  # TensorFlow's traced functions with it, gone when it stops
        process.serve_folder(
            folder,
            host=host,
            port=port,
            name=name,
            token=token,
            max_age_s=max_age_s,
            hosts=process.allowed_hosts(config.settings()),
        )


@cli.command()
@click.option(
    "--run",
    "run_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="The run whose model scores (its checkpoint, reloaded as the run writes new ones).",
)
@click.option("--topic", required=True, help="The topic of records to score.")
@click.option("--output-topic", help="Where predictions go (default: TOPIC.predictions).")
@click.option(
    "--input-format",
    type=click.Choice(["wire", "json"]),
    default="wire",
    show_default=True,
    help="wire: records as `streamtrain produce` writes them; json: each value one JSON instance "
    '(a list of numbers, or {"instances": [one]}) in the same units.',
)
@bootstrap_option
@kafka_conf_option
@click.option(
    "--checkpoint",
    type=click.Path(file_okay=False),
    help="The query's checkpoint: a restart continues after it (default: RUN/predict-TOPIC).",
)
@click.option("--available-now", is_flag=True, help="Score what the topic holds now, then stop.")
@click.option("--max-batches", type=int, help="Stop after this many micro-batches.")
@click.option("--timeout", "timeout_s", type=float, help="Stop after this many seconds.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--metrics-port", type=int, help="Serve /metrics here (0: a free port).")
def predict(bootstrap: str | None, kafka_conf: str | None, **options: Any) -> None:
    """Score a topic's records with a run's model, writing one prediction per record, keyed
    like its input, with its source partition and offset and the weights' version."""
    from pipeline.cluster import scratch
    from pipeline.jobs import predict as predict_job

    kafka_conf = resolve_kafka_conf(kafka_conf)
    with scratch.scratch():  # its temporary files and its Spark's, gone when it stops
        summary = predict_job.run(
            predict_job.PredictConfig(
                bootstrap=resolve_bootstrap(bootstrap, kafka_conf), kafka_conf=kafka_conf, **options
            )
        )
    click.echo(summary.summary())
