"""A run's model server (``--serve-port``), in a child process of its own.

A restarted run starts it first thing, on the checkpoint and the model its folder records,
so that serving is not down while Spark and the workers start (12-30 s); it follows the
parameter server's live center once that is up. A new run has nothing to serve before its
parameter server: its server starts then, on the live center.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError
from pipeline.jobs.run_config import RunConfig
from pipeline.train import checkpoint

log = logging.getLogger(__name__)


def start_early(
    stack: contextlib.ExitStack,
    cfg: RunConfig,
    settings: Any,
    out: Path,
    prior: checkpoint.State | None,
) -> Any:
    """A restarted run's model server, answering from its checkpoint at once; None for a
    new run, without --serve-port, or for a folder that records no model (an older run's:
    its server starts with the parameter server, as a new run's)."""
    from pipeline.serve.predictor import read_description
    from pipeline.serve.process import ServingProcess, allowed_hosts, host_and_token

    if cfg.serve_port is None or prior is None:
        return None
    try:
        read_description(out)
    except ConfigError as e:
        log.info("the model server starts with the parameter server: %s", e)
        return None
    host, token = host_and_token(settings)
    serving = ServingProcess.for_restart(
        run_dir=out,
        name=cfg.name,
        host=host,
        port=cfg.serve_port,
        token=token,
        max_age_s=cfg.serve_max_age_s,
        log_path=out / "serve.log",
        hosts=allowed_hosts(settings),
    ).start()
    stack.callback(serving.stop)
    return serving


def start(
    stack: contextlib.ExitStack,
    cfg: RunConfig,
    settings: Any,
    out: Path,
    spec: Any,
    schema: Any,
    server: Any,
    early: Any,
    rows: Any = None,
) -> Any:
    """The run's model server on the parameter ``server``'s live center (and the ID tables'
    live ``rows``): ``early`` (from :func:`start_early`) told to follow it, or a new server's
    process (it imports TensorFlow while the workers warm up); None without --serve-port."""
    from pipeline.serve.process import ServingProcess, allowed_hosts, host_and_token

    if early is not None:
        return early.follow(server, spec.size, rows)
    if cfg.serve_port is None:
        return None
    host, token = host_and_token(settings)
    serving = ServingProcess.for_run(
        name=cfg.name,
        spec=spec,
        schema=schema,
        server=server,
        rows=rows,
        host=host,
        port=cfg.serve_port,
        token=token,
        max_age_s=cfg.serve_max_age_s,
        log_path=out / "serve.log",
        hosts=allowed_hosts(settings),
        run_dir=out,
    ).start()
    stack.callback(serving.stop)
    return serving
