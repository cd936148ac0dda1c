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
        prior: checkpoint.State | None = checkpoint.rewind(
            out, cfg.generation, out / "spark-checkpoint"
        )
    else:
        prior = checkpoint.load(out) if cfg.resume else None
    if cfg.resume and prior is None:
        raise ConfigError(f"Nothing to resume in {out}: no {checkpoint.FILENAME} there.")
    if cfg.resume and not cfg.bootstrap:
        raise ConfigError(
            f"The run in {out} read the embedded broker, which kept its records in memory: they "
            "went with it, so it cannot be continued. Start a new run with another --out (runs "
            "to resume need a Kafka that outlives them: --bootstrap)."
        )
    if not cfg.resume and (out / checkpoint.FILENAME).exists():
        raise ConfigError(
            f"{out} holds a previous run; pass --resume to continue it, or another --out."
        )
    if cfg.bootstrap:
        # Before anything starts: a refused password or certificate is one line here.
        client.check_reachable(
            client.parse_bootstrap(cfg.bootstrap), conf=conf.load(cfg.kafka_conf)
        )
    return prior


def describe(prior: checkpoint.State | None, spark_checkpoint: Path | None = None) -> str:
    """What a resumed run starts from, for its first start-up line: the checkpoint, and the
    batch Spark starts with, read from its offset and commit logs in ``spark_checkpoint``.

    Example:
        >>> import numpy as np, tempfile
        >>> state = checkpoint.State(
        ...     np.zeros(1, np.float32), last_batch_id=4, extra={"trained": 5000}
        ... )
        >>> with tempfile.TemporaryDirectory() as d:
        ...     for log, last in (("offsets", 4), ("commits", 4)):
        ...         (Path(d) / log).mkdir()
        ...         _ = (Path(d) / log / str(last)).write_text("")
        ...     describe(state, Path(d))
        'resuming after batch 4 (5,000 records trained; Spark starts with batch 5); '
    """
    if prior is None:
        return ""
    head = (
        f"resuming after batch {prior.last_batch_id} ({int(prior.extra.get('trained', 0)):,} "
        "records trained; "
    )
    planned, committed = (
        _last_logged(spark_checkpoint / log) if spark_checkpoint else -1
        for log in ("offsets", "commits")
    )
    if planned <= committed:  # a clean stop: both logs end at the same batch
        return head + f"Spark starts with batch {committed + 1}); "
    if planned <= prior.last_batch_id:  # saved, then stopped before Spark's commit
        return (
            head
            + f"Spark replays batch {planned}, which it had not committed: the checkpoint holds "
            "it, so it is skipped); "
        )
    return head + f"Spark runs batch {planned} with the offsets it had planned before the stop); "


def _last_logged(log: Path) -> int:
    """The last batch id in one of Spark's checkpoint logs (``offsets``, ``commits``); -1: none."""
    try:
        return max((int(p.name) for p in log.iterdir() if p.name.isdigit()), default=-1)
    except OSError:
        return -1
