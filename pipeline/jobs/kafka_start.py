"""A run's Kafka side at its start: the broker (the user's, or an embedded one), the
topic, what releases trained records, and the run's own replay into the topic."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path
from typing import Any

from pipeline.ingest.kafka.release import Releaser
from pipeline.jobs.replay_process import ReplayProcess
from pipeline.jobs.run_config import RunConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Kafka:
    """What :func:`start` started: the bootstrap address, and the releaser and replay (None
    where the run has none)."""

    bootstrap: str
    releaser: Releaser | None
    replay: ReplayProcess | None


def start(
    stack: contextlib.ExitStack,
    cfg: RunConfig,
    *,
    out: Path,
    topic: str,
    display: Any,
    replay_job: Any,
    data_dir: Path,
    metrics_host: str,
) -> Kafka:
    """Start what the run needs of Kafka; each part is stopped by ``stack``."""
    from pipeline.ingest.kafka import EmbeddedBroker, client, conf

    secured = conf.load(cfg.kafka_conf)
    embedded = None
    if cfg.bootstrap:
        bootstrap = client.parse_bootstrap(cfg.bootstrap)
    else:
        embedded = stack.enter_context(
            EmbeddedBroker(engine=cfg.broker_engine, log_path=out / "broker.log")
        )
        bootstrap = embedded.bootstrap
        log.info("embedded Kafka at %s", bootstrap)
    display.startup(
        f"Kafka ready at {bootstrap}" + (f" ({secured.describe()})" if cfg.kafka_conf else "")
    )
    client.ensure_topic(bootstrap, topic, partitions=cfg.workers, conf=secured)
    releaser = replay = None
    if embedded is not None and embedded.engine in ("noida", "kafka"):
        # The run's own broker and topic, on an engine that can delete: trained records
        # are released, so a replay that never stops does not grow it (Tansu never frees).
        releaser = Releaser(bootstrap, topic, conf=secured)
        stack.callback(releaser.close)
    if not (
        cfg.topic and cfg.bootstrap
    ):  # the run's own replay: a resumed one sends what the topic lacks
        replay = ReplayProcess.for_run(
            cfg,
            table=replay_job,
            data_dir=data_dir,
            bootstrap=bootstrap,
            topic=topic,
            out=out,
            metrics_host=metrics_host,
        ).start()
        stack.callback(replay.stop)
    return Kafka(bootstrap, releaser, replay)
