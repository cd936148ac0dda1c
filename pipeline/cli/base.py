"""The `streamtrain` command group, its logging, and what several commands share."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from pipeline import config
from pipeline.errors import ConfigError

#: ``--bootstrap``, for the commands that talk to Kafka.
bootstrap_option = click.option(
    "--bootstrap",
    metavar="HOST:PORT",
    help="Use this Kafka instead of the embedded broker (env STREAMTRAIN_BOOTSTRAP).",
)


#: ``--kafka-conf``, for the commands that talk to Kafka.
kafka_conf_option = click.option(
    "--kafka-conf",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="A Kafka client properties file (security.protocol, sasl.mechanism, sasl.username, "
    "sasl.password, ssl.*), as librdkafka and the Java client read it; env "
    "STREAMTRAIN_KAFKA_CONF. docs/kafka.md: Secured clusters.",
)


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname).1s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    # kafka-python logs every reconnect attempt at WARNING/ERROR; our own errors say it once.
    logging.getLogger("kafka").setLevel(logging.CRITICAL if not verbose else logging.INFO)
    logging.getLogger("py4j").setLevel(logging.WARNING if not verbose else logging.INFO)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def cli(verbose: bool) -> None:
    """Online training of Keras models from Kafka streams, distributed with Spark."""
    _setup_logging(verbose)


def resolve_kafka_conf(kafka_conf: str | None) -> str | None:
    """--kafka-conf, else $STREAMTRAIN_KAFKA_CONF: the file's absolute path, checked now (a
    bad file is one line before anything starts); None for PLAINTEXT."""
    from pipeline.ingest.kafka import conf

    chosen = kafka_conf or config.settings().kafka_conf
    if not chosen:
        return None
    path = str(Path(chosen).expanduser().absolute())
    conf.load(path)
    return path


def resolve_bootstrap(bootstrap: str | None, kafka_conf: str | None = None) -> str:
    """--bootstrap, else $STREAMTRAIN_BOOTSTRAP, else ``bootstrap.servers`` of the Kafka
    client file, else a running `streamtrain broker`."""
    from pipeline.ingest.kafka import broker, client, conf

    chosen = (
        bootstrap
        or config.settings().bootstrap
        or conf.load(kafka_conf).bootstrap
        or broker.running_bootstrap()
    )
    if not chosen:
        raise ConfigError(
            "No Kafka to send to: no --bootstrap, no STREAMTRAIN_BOOTSTRAP and no running "
            "embedded broker. Start one with `streamtrain broker` in another terminal, or pass "
            "--bootstrap HOST:PORT."
        )
    return client.parse_bootstrap(chosen)
