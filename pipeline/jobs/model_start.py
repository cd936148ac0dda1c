"""The model's start in a run: the zygote that imports TensorFlow once for the processes
it forks, the describer that builds the model (the user's, or the data's default) and
checks its contract, and the user's own compile where the algorithm can train with it."""

from __future__ import annotations

import contextlib
import logging
import tempfile
from pathlib import Path
from typing import Any

from pipeline.cluster.zygote import Zygote
from pipeline.errors import ConfigError
from pipeline.jobs import user_data
from pipeline.jobs.run_config import RunConfig
from pipeline.train.probe import Probe

log = logging.getLogger(__name__)

#: What the zygote imports for the processes it forks: the model's describer, Spark's
#: Python workers (TensorFlow and Keras, the training path, PySpark's worker and daemon)
#: and the helpers the query's Python source starts (PySpark SQL, pandas, Arrow).
_PRELOAD = (
    "tensorflow",
    "keras",
    "pipeline.train.handler",
    "pipeline.train.probe",
    "pipeline.train.evaluation",
    "pipeline.ingest.reader",
    "pipeline.ingest.spark_source",
    "pyspark.daemon",
    "pyspark.worker",
    "pyspark.sql.worker.lookup_data_sources",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.streaming.python_streaming_source_runner",
)


def start_zygote(stack: contextlib.ExitStack, out: Path) -> Zygote:
    """The process that imports TensorFlow once for the workers and the describer
    (``STREAMTRAIN_PRELOAD=false``: each imports its own)."""
    zygote = Zygote(_PRELOAD, log_path=out / "zygote.log").start()
    stack.callback(zygote.stop)  # registered before Spark's stop, so it runs after it
    return zygote


def describe(
    cfg: RunConfig, algorithm: Any, schema: Any, stack: contextlib.ExitStack, zygote: Zygote | None
) -> Probe:
    """Start describing the model (the user's, or the data's default) and checking its contract."""
    default = cfg.dataset
    if schema.table is not None:
        label = schema.table.label
        dims = [f.dim for f in schema.table.ids]
        default = (
            f"table_ids:{schema.table.model_width - sum(dims)}:{schema.num_classes}:"
            + ",".join(map(str, dims))
            if dims
            else f"table:{schema.n_features}:{schema.num_classes}"
        ) + (f":{label.scale[0]}:{label.scale[1]}" if schema.regression else "")
    probe = Probe(
        cfg.model,
        default,
        optimizer=algorithm.worker_optimizer,
        loss=algorithm.loss,
        folder=Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="streamtrain-model-"))),
        zygote=zygote,
        expect=user_data.contract(schema),
        seed=cfg.seed,
    )
    stack.callback(probe.cancel)
    return probe


def use_compiled(algo: Any, spec: Any) -> bool:
    """Train with the optimizer and loss the user compiled the model with, where the
    algorithm can (synchronous SGD runs its optimizer on the server: Adam or SGD); say
    in one line when it cannot."""
    try:
        if algo.synchronous and algo.pushes_gradients:
            from pipeline.train.algorithms import optimizers

            optimizers.get(spec.optimizer, 0)
    except ConfigError as e:
        log.warning(
            "the model's compiled optimizer is not used: %s; training with %s",
            e,
            algo.worker_optimizer,
        )
        return False
    algo.worker_optimizer, algo.loss = spec.optimizer, spec.loss
    return True
