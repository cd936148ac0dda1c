"""What a run starts from: its output folder checked against the options (a new run, or
one to resume, or a kept generation to go back to) and the checkpoint it resumes, said in
its first start-up line."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import ConfigError
from pipeline.jobs.run_config import RunConfig
from pipeline.train import checkpoint

__all__ = ["check_out", "describe"]


def check_out(cfg: RunConfig, out: Path) -> checkpoint.State | None:
    """Check that the output folder and Kafka fit the options; the checkpoint to resume
    (None: a new run)."""
    from pipeline.ingest.kafka import client, conf

    if cfg.generation is not None:
        prior: checkpoint.State | None = checkpoint.rewind(out, cfg.generation, out / "spark-checkpoint")
    else:
        prior = checkpoint.load(out) if cfg.resume else None
    if cfg.resume and prior is None:
        raise ConfigError(f"Nothing to resume in {out}: no {checkpoint.FILENAME} there.")
    if cfg.resume and not cfg.bootstrap:
        raise ConfigError(f"The run in {out} read the embedded broker, which kept its records in memory: they went "
                          "with it, so it cannot be continued. Start a new run with another --out (runs to resume "
                          "need a Kafka that outlives them: --bootstrap).")
    if not cfg.resume and (out / checkpoint.FILENAME).exists():
        raise ConfigError(f"{out} holds a previous run; pass --resume to continue it, or another --out.")
    if cfg.bootstrap:
        # Before anything starts: a refused password or certificate is one line here.
        client.check_reachable(client.parse_bootstrap(cfg.bootstrap), conf=conf.load(cfg.kafka_conf))
    return prior


def describe(prior: checkpoint.State | None) -> str:
    """What a resumed run starts from, for its first start-up line."""
    if prior is None:
        return ""
    return (f"resuming after batch {prior.last_batch_id} ({int(prior.extra.get('trained', 0)):,} records trained; Spark "
            f"replays a batch it had not committed); ")
