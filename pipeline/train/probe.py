"""Describe the model to train in a short-lived process, so that the driver never imports TensorFlow.

TensorFlow costs a process half a gigabyte before it does anything; the driver
needs the model only as data (a :class:`~pipeline.train.model.ModelSpec` and its
initial weights), and the workers already hold TensorFlow for training and
scoring. The child loads the model, writes ``spec.json`` and ``weights.npy``
into a folder and exits; an error comes back as its one-line message.

    python -m pipeline.train.probe SOURCE DATASET OPTIMIZER_JSON LOSS FOLDER
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
        raise ConfigError(f"{path} failed to import (SyntaxError: {e.msg}, line {e.lineno}).") from None
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    defined |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom | ast.Import) for a in n.names}
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
            return keras.models.load_model(source, compile=False)
        except Exception as e:
            raise ConfigError(f"{source} is not a loadable Keras model ({type(e).__name__}: {e}).") from None
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
    and skips the import.
    """

    def __init__(self, source: str | None, dataset: str, *, optimizer: str | dict[str, Any], loss: str,
                 folder: Path, zygote: Zygote | None = None) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        args = [source or "", dataset, json.dumps(optimizer), loss, str(folder)]
        env = {"TF_CPP_MIN_LOG_LEVEL": "2"}
        # Its output goes to a file: a pipe nobody reads until the end could fill and stall it.
        self._log = open(folder / "probe.log", "w+")  # noqa: SIM115
        self._proc: subprocess.Popen[str] | Child
        try:
            if zygote is None:
                raise ZygoteError("none")
            self._proc = zygote.run("pipeline.train.probe", args, stdout=self._log.fileno(),
                                    stderr=self._log.fileno(), env=env)
        except ZygoteError:
            self._proc = subprocess.Popen([sys.executable, "-m", "pipeline.train.probe", *args], stdout=self._log,
                                          stderr=subprocess.STDOUT, text=True, env={**os.environ, **env})

    def result(self) -> tuple[ModelSpec, np.ndarray]:
        """The spec and the initial weights; a ConfigError with the child's message if it failed."""
        self._proc.wait()
        self._log.seek(0)
        err = self._log.read()
        self._log.close()
        if self._proc.returncode != 0:
            # TensorFlow may log to stderr too: the message is the line with the marker.
            said = [line.removeprefix(_MARK) for line in err.splitlines() if line.startswith(_MARK)]
            raise ConfigError(said[-1] if said else f"Describing the model failed (exit {self._proc.returncode}): "
                              f"{(err.strip().splitlines() or ['no output'])[-1]}")
        spec = ModelSpec.from_json((self.folder / "spec.json").read_text())
        return spec, np.load(self.folder / "weights.npy", allow_pickle=False)

    def cancel(self) -> None:
        if self._proc.returncode is None:
            self._proc.kill()
            self._proc.wait()
        self._log.close()


def main(argv: list[str]) -> int:
    source, dataset, optimizer, loss, folder = argv
    try:
        model = load_model(source or None, dataset)
        spec = ModelSpec.from_model(model, optimizer=json.loads(optimizer), loss=loss)
        out = Path(folder)
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
