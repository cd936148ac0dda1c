"""Describe the model to train in a short-lived process, so that the driver never imports
TensorFlow.

TensorFlow costs a process half a gigabyte before it does anything; the driver
needs the model only as data (a :class:`~pipeline.train.model.ModelSpec` and its
initial weights), and the workers already hold TensorFlow for training and
scoring. The child loads the model, writes ``spec.json`` and ``weights.npy``
into a folder and exits; an error comes back as its one-line message.

    python -m pipeline.train.probe SOURCE DATASET OPTIMIZER_JSON LOSS FOLDER [EXPECT_JSON]

EXPECT_JSON is the model's contract with the data, checked before anything trains:
``{"input": [...], "outputs": N, "what": "..."}``. A model the user compiled keeps its
optimizer and loss (``compiled.json`` says which); otherwise the algorithm's are used.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.cluster.zygote import Child, Zygote, ZygoteError
from pipeline.errors import ConfigError, StreamtrainError
from pipeline.train.model import ModelSpec, get_flat

_MARK = "streamtrain-model-error: "


def check_source(source: str) -> None:
    """Check ``--model`` without importing anything: a ``.keras`` file that exists, or a
    ``FILE.py:BUILD_FN`` whose file exists, parses, and defines ``BUILD_FN`` at its top level.

    >>> check_source("nope.keras")
    Traceback (most recent call last):
    ...
    pipeline.errors.ConfigError: Expected a Keras model file at nope.keras; there is none.
    """
    if source.endswith(".keras"):
        if not Path(source).is_file():
            raise ConfigError(f"Expected a Keras model file at {source}; there is none.")
        return
    path, _, fn = source.partition(":")
    if not path.endswith(".py") or not fn:
        raise ConfigError(f"Expected --model FILE.py:BUILD_FN or FILE.keras. Received: {source!r}")
    if not Path(path).is_file():
        raise ConfigError(f"Expected a Python file at {path}; there is none.")
    import ast

    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except SyntaxError as e:
        raise ConfigError(
            f"{path} failed to import (SyntaxError: {e.msg}, line {e.lineno})."
        ) from None
    defined = {
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    }
    defined |= {
        t.id
        for n in tree.body
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    defined |= {
        a.asname or a.name
        for n in tree.body
        if isinstance(n, ast.ImportFrom | ast.Import)
        for a in n.names
    }
    if fn not in defined:
        raise ConfigError(f"{path} has no function {fn!r} to build the model.")


def load_model(source: str | None, dataset: str) -> Any:
    """The user's model (``file.py:build_fn`` or a ``.keras`` file), or the dataset's default."""
    from pipeline.train import zoo

    if source is None:
        return zoo.for_dataset(dataset)
    if source.endswith(".keras"):
        if not Path(source).is_file():
            raise ConfigError(f"Expected a Keras model file at {source}; there is none.")
        import keras

        try:
            try:  # with the optimizer and loss it was saved with, which the run then keeps
                return keras.models.load_model(source)
            except Exception:
                return keras.models.load_model(source, compile=False)
        except Exception as e:
            raise ConfigError(
                f"{source} is not a loadable Keras model ({type(e).__name__}: {e})."
            ) from None
    path, _, fn = source.partition(":")
    if not path.endswith(".py") or not fn:
        raise ConfigError(f"Expected --model FILE.py:BUILD_FN or FILE.keras. Received: {source!r}")
    if not Path(path).is_file():
        raise ConfigError(f"Expected a Python file at {path}; there is none.")
    spec = importlib.util.spec_from_file_location(f"streamtrain_user_model_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    except Exception as e:
        raise ConfigError(f"{path} failed to import ({type(e).__name__}: {e}).") from None
    build = getattr(module, fn, None)
    if not callable(build):
        raise ConfigError(f"{path} has no function {fn!r} to build the model.")
    model = build()
    if not hasattr(model, "get_weights"):
        raise ConfigError(f"{path}:{fn}() returned {type(model).__name__}, not a Keras model.")
    return model


class Probe:
    """Describes a model in a child process started at construction; :meth:`result` waits for it.

    Started early, the child's TensorFlow import overlaps the JVM's start. With a
    ``zygote`` (TensorFlow already imported there) the child is forked from it instead,
    and skips the import. With a ``seed`` the model's initial weights are the same on every
    run (Keras's random seed set before it is built).
    """

    def __init__(
        self,
        source: str | None,
        dataset: str,
        *,
        optimizer: str | dict[str, Any],
        loss: str,
        folder: Path,
        zygote: Zygote | None = None,
        expect: dict[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        args = [
            source or "",
            dataset,
            json.dumps(optimizer),
            loss,
            str(folder),
            json.dumps(expect or {}),
            "" if seed is None else str(seed),
        ]
        env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
        # Its output goes to a file: a pipe nobody reads until the end could fill and stall it.
        self._log = open(folder / "probe.log", "w+")  # noqa: SIM115
        self._proc: subprocess.Popen[str] | Child
        try:
            if zygote is None:
                raise ZygoteError("none")
            self._proc = zygote.run(
                "pipeline.train.probe",
                args,
                stdout=self._log.fileno(),
                stderr=self._log.fileno(),
                env=env,
            )
        except ZygoteError:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "pipeline.train.probe", *args],
                stdout=self._log,
                stderr=subprocess.STDOUT,
                text=True,
                env={**os.environ, **env},
            )

    def result(self) -> tuple[ModelSpec, np.ndarray]:
        """The spec and the initial weights; a ConfigError with the child's message if it failed."""
        self._proc.wait()
        self._log.seek(0)
        err = self._log.read()
        self._log.close()
        if self._proc.returncode != 0:
            # TensorFlow may log to stderr too: the message is the line with the marker.
            said = [line.removeprefix(_MARK) for line in err.splitlines() if line.startswith(_MARK)]
            raise ConfigError(
                said[-1]
                if said
                else f"Describing the model failed (exit {self._proc.returncode}): "
                f"{(err.strip().splitlines() or ['no output'])[-1]}"
            )
        spec = ModelSpec.from_json((self.folder / "spec.json").read_text())
        return spec, np.load(self.folder / "weights.npy", allow_pickle=False)

    def compiled(self) -> bool:
        """Whether the spec's optimizer and loss are the ones the user compiled the model with."""
        return (self.folder / "compiled.json").exists()

    def cancel(self) -> None:
        if self._proc.returncode is None:
            self._proc.kill()
            self._proc.wait()
        self._log.close()


def check_contract(model: Any, expect: dict[str, Any]) -> None:
    """The model's input shape and output units against the data's, in one line naming both."""
    from pipeline.train.model import input_shape

    if not expect:
        return
    shape = input_shape(model)
    want = tuple(expect["input"])
    outputs = int(np.shape(model(np.zeros((1, *shape), np.float32)))[-1])
    if int(np.prod(shape)) != int(np.prod(want)) or outputs != expect["outputs"]:
        raise ConfigError(
            f"Expected a model with input {list(want)} and {expect['outputs']} output unit(s) for "
            f"{expect['what']}. Received: input {list(shape)} and {outputs} output unit(s). "
            "Change the model's Input or its last layer."
        )


def compiled_with(model: Any) -> tuple[dict[str, Any], str] | None:
    """The optimizer and loss the user compiled the model with, if it was compiled with a
    loss by name (what the workers can rebuild); None otherwise."""
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        return None
    loss = getattr(model, "loss", None)
    if not isinstance(loss, str):
        return None
    import keras

    config = keras.optimizers.serialize(model.optimizer)
    return {"class_name": config["class_name"], "config": config["config"]}, loss


def main(argv: list[str]) -> int:
    source, dataset, optimizer, loss, folder, *rest = argv
    try:
        if len(rest) > 1 and rest[1]:  # --seed: the same initial weights on every run
            import keras

            keras.utils.set_random_seed(int(rest[1]))
        model = load_model(source or None, dataset)
        check_contract(model, json.loads(rest[0]) if rest else {})
        own = compiled_with(model)
        out = Path(folder)
        if own is not None:
            optimizer, loss = json.dumps(own[0]), own[1]
            (out / "compiled.json").write_text(json.dumps({"optimizer": own[0], "loss": own[1]}))
        spec = ModelSpec.from_model(model, optimizer=json.loads(optimizer), loss=loss)
        np.save(out / "weights.npy", get_flat(model))
        (out / "spec.json").write_text(spec.to_json())
    except StreamtrainError as e:
        print(f"{_MARK}{e}", file=sys.stderr)
        return 2
    except Exception as e:  # the user's build function failed: one line, not a traceback
        print(f"{_MARK}Building the model failed ({type(e).__name__}: {e}).", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
