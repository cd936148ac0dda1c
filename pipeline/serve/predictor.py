"""The served model: one Keras model, the newest weights a source holds, one compiled call.

TensorFlow lives only in the process that serves (``streamtrain serve``, or the child
``run --serve-port`` starts): the training driver stays free of it.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pipeline import codec
from pipeline.errors import ConfigError, StreamtrainError
from pipeline.serve.weights import Snapshot
from pipeline.train.model import FlatWeights, ModelSpec

#: Written by ``streamtrain run`` into its folder (:mod:`pipeline.jobs.run_record`): the run's
#: options and what ``streamtrain serve`` and ``predict`` rebuild.
RECORD_FILE = "run.json"
#: Where runs before the record described their model (still read).
MODEL_FILE = "model.json"


class Unavailable(StreamtrainError):
    """No weights fit to serve: none read yet, or older than the bound (HTTP 503)."""


class WeightSource(Protocol):
    def latest(self) -> Snapshot | None: ...


def description(spec: ModelSpec, schema: codec.Schema, name: str) -> dict[str, Any]:
    """What serving needs to rebuild a run's model: its spec, its records' schema and its
    name (the run's record holds them)."""
    return {"name": name, "spec": json.loads(spec.to_json()), "schema": schema_dict(schema)}


def schema_dict(schema: codec.Schema) -> dict[str, Any]:
    """A schema as plain data (a table's with its features, so serving transforms raw
    instances as training did).

    >>> schema_from_dict(schema_dict(codec.MNIST)) == codec.MNIST
    True
    """
    out = {
        "name": schema.name,
        "schema_id": schema.schema_id,
        "dtype": schema.dtype,
        "n_features": schema.n_features,
        "num_classes": schema.num_classes,
        "input_shape": list(schema.input_shape),
    }
    if schema.table is not None:
        out["table"] = schema.table.to_dict()
    return out


def schema_from_dict(d: dict[str, Any]) -> codec.Schema:
    if d.get("table") is not None:
        from pipeline.table import TableSchema

        return codec.table(str(d["name"]), TableSchema.from_dict(d["table"]))
    return codec.Schema(
        str(d["name"]),
        int(d["schema_id"]),
        str(d["dtype"]),
        int(d["n_features"]),
        int(d["num_classes"]),
        tuple(int(v) for v in d["input_shape"]),
    )


def read_description(folder: Path) -> tuple[str, ModelSpec, codec.Schema]:
    """The name, spec and schema ``streamtrain run`` recorded in ``folder``."""
    path = folder / RECORD_FILE
    if not path.is_file() and (folder / MODEL_FILE).is_file():
        path = folder / MODEL_FILE  # a run older than the record
    try:
        d = json.loads(path.read_text())
        return (
            str(d["name"]),
            ModelSpec.from_json(json.dumps(d["spec"])),
            schema_from_dict(d["schema"]),
        )
    except FileNotFoundError:
        raise ConfigError(
            f"Expected a run folder with {RECORD_FILE} (written by streamtrain run once its model "
            f"is described). Received: {folder}, which has none; pass the folder a run wrote."
        ) from None
    except KeyError as e:
        raise ConfigError(
            f"{path} does not describe the model yet (no {e}): the run stopped before its model "
            "was described; pass the folder of a run that trained."
        ) from None
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{path} is unreadable ({e}); pass the folder of a run.") from None


class Predictor:
    """Predicts with the newest weights ``source`` holds, never older than ``max_age_s``.

    Args:
        spec: the model.
        schema: its records' layout (requests send features in the producer's units).
        source: a :mod:`pipeline.serve.weights` source.
        max_age_s: refuse (:class:`Unavailable`) weights older than this; None: any age
            (a finished run's checkpoint).
        threads: TensorFlow threads.
    """

    def __init__(
        self,
        spec: ModelSpec,
        schema: codec.Schema,
        source: WeightSource,
        *,
        max_age_s: float | None,
        threads: int = 2,
    ) -> None:
        from pipeline.train.replica import init_tensorflow

        init_tensorflow(threads)
        import tensorflow as tf

        self.spec, self.schema, self.source, self.max_age_s = spec, schema, source, max_age_s
        self.model = spec.build(compile=False)
        self._weights = FlatWeights(self.model, spec.shapes)
        self._loaded: Snapshot | None = None
        self._lock = threading.Lock()
        shape = (
            tuple(int(d) for d in self.model.inputs[0].shape[1:])
            if self.model.inputs
            else schema.input_shape
        )
        self.input_shape = shape
        model = self.model
        self._call = tf.function(
            lambda x: model(x, training=False),
            reduce_retracing=True,
            input_signature=[tf.TensorSpec([None, *shape], tf.float32)],
        )
        # Traced now, not on the first request: a server that says it listens answers at
        # once (the trace took seconds on a loaded 2-core machine).
        self._call(tf.zeros((1, *shape), tf.float32))
        #: The live ID tables (a :class:`~pipeline.train.ps.row_client.RowClient`) where the
        #: model has ID features; None: none, or not yet reachable.
        self.rows: Any = None
        self.unknown_ids = 0  # IDs served the shared row (no row of their own yet)
        table = getattr(schema, "table", None)
        self._layout: Any = None
        if table is not None and table.ids:
            from pipeline.table.ids import IdLayout

            self._layout = IdLayout(table)

    def snapshot(self) -> Snapshot:
        """The weights a prediction would use now; raises :class:`Unavailable`."""
        snap = self.source.latest()
        if snap is None:
            raise Unavailable(
                "No weights to serve yet: the first read of the parameter server or checkpoint "
                "has not finished."
            )
        age = snap.age_s()
        if self.max_age_s is not None and snap.bounded and age > self.max_age_s:
            raise Unavailable(
                f"The newest weights are {age:.1f} s old, over the bound of {self.max_age_s:g} s: "
                "the parameter server is not answering (see the server's log)."
            )
        return snap

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, Snapshot]:
        """Outputs for ``x`` (features in the producer's units, one row per instance) and
        the snapshot of the weights that produced them."""
        snap = self.snapshot()
        # The same scaling as training (pixels / 255), from the producer's units.
        inputs = np.ascontiguousarray(self.schema.to_model_input(x))
        with self._lock:  # one weight load and one call at a time: a call never sees half a load
            if self._layout is not None:
                inputs = self._with_rows(inputs)
            inputs = inputs.reshape((len(x), *self.input_shape))
            if self._loaded is not snap:
                self._weights.set(snap.weights)
                self._loaded = snap
            out = self._call(inputs).numpy()
        return out, snap

    @property
    def has_ids(self) -> bool:
        """Whether the model reads ID rows from tables."""
        return self._layout is not None

    def take_unknown(self) -> int:
        """The IDs served the shared row since the last call."""
        with self._lock:
            n, self.unknown_ids = self.unknown_ids, 0
        return n

    def _with_rows(self, x: np.ndarray) -> np.ndarray:
        """The IDs' rows read from the live tables (under the lock: one connection)."""
        from pipeline.train.id_rows import model_input

        if self.rows is None:
            raise Unavailable("The ID tables are not reachable yet: the run is starting.")
        inputs, unknown = model_input(self._layout, self.rows, x)
        self.unknown_ids += unknown
        return inputs
