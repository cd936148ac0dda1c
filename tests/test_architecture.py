"""The rules docs/architecture.md states, checked: each fails when the code breaks the rule."""

from __future__ import annotations

import ast
import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: What each part may import from the project (besides itself). Lower parts never see higher ones.
ALLOWED = {
    "pipeline.errors": set(),
    "pipeline.exports": set(),  # the lazy re-exports of the packages' __init__
    "pipeline.config": {"pipeline.errors"},
    "pipeline.codec": {"pipeline.errors"},
    "pipeline.record_key": {"pipeline.errors", "pipeline.codec"},  # the Kafka key, codec's level
    # A user's table: its schema, its records' formats and its transform (codec's level: a
    # codec.Schema carries one, and calls it without importing it).
    "pipeline.table": {"pipeline.errors", "pipeline.codec"},
    "pipeline.cluster": {"pipeline.errors", "pipeline.config"},
    "pipeline.observe": {"pipeline.errors", "pipeline.exports", "pipeline.config"},
    "pipeline.ingest": {
        "pipeline.errors",
        "pipeline.exports",
        "pipeline.config",
        "pipeline.codec",
        "pipeline.record_key",
        "pipeline.cluster",
    },
    "producers": {
        "pipeline.errors",
        "pipeline.config",
        "pipeline.codec",
        "pipeline.record_key",
        "pipeline.table",
        "pipeline.ingest.kafka",
        "pipeline.observe.metrics",
        "pipeline.observe.exposition",
    },
    "pipeline.train": {
        "pipeline.errors",
        "pipeline.exports",
        "pipeline.config",
        "pipeline.codec",
        "pipeline.record_key",
        "pipeline.table",
        "pipeline.cluster",
        "pipeline.ingest",
    },
    "pipeline.serve": {
        "pipeline.errors",
        "pipeline.exports",
        "pipeline.config",
        "pipeline.codec",
        "pipeline.record_key",
        "pipeline.table",
        "pipeline.cluster",
        "pipeline.ingest",
        "pipeline.train",
        "pipeline.observe",
    },
    "pipeline.jobs": {
        "pipeline.errors",
        "pipeline.exports",
        "pipeline.config",
        "pipeline.codec",
        "pipeline.record_key",
        "pipeline.table",
        "pipeline.cluster",
        "pipeline.ingest",
        "pipeline.train",
        "pipeline.observe",
        "pipeline.serve",
        "producers",
    },
    "pipeline.cli": {"pipeline", "producers"},  # the edge: anything but itself
}

#: Modules that may call ``config.settings()``: the edge, the jobs that wire a run, and where a
#: process starts that no caller configures (each with why).
READS_SETTINGS = {
    "pipeline.cli": "the edge",
    "pipeline.jobs": "the wiring of a run",
    "pipeline.ingest.reader": "an executor picks its Kafka reader",
    "pipeline.train.handler": "an executor's fault-injection hook (tests)",
    "pipeline.ingest.kafka.broker": "the broker's binaries and engine (`streamtrain broker`, "
    "tests, benchmarks)",
    "pipeline.ingest.kafka.engines": "which program each broker engine runs (Kafka's version, "
    "heap and jars)",
    "pipeline.cluster.jvmcache": "Spark's and Java's homes, and the JVM class cache",
    "pipeline.cluster.maven": "the Maven repository Java libraries are resolved from (a mirror)",
    "pipeline.cluster.standalone": "Spark's home for the standalone daemons",
}

#: Modules that read ``os.environ`` besides the config module, with why (both hand the
#: environment to processes they start; neither reads a setting).
READS_ENVIRONMENT = {
    "pipeline.config": "the one reader of settings",
    "pipeline.cluster.session": "saves and restores the Python it points Spark's children at",
    "pipeline.cluster.zygote": "hands its environment to the children it forks",
    "pipeline.cluster.scratch": "points a run's processes at its temporary folder, and restores "
    "what it replaced",
}

#: Modules that import TensorFlow or Keras: they run in executors and child processes only.
TENSORFLOW_MODULES = {
    "pipeline.train.model",
    "pipeline.train.zoo",
    "pipeline.train.replica",
    "pipeline.train.input_step",
    "pipeline.train.probe",
    "pipeline.serve.predictor",
}

MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 250


def _within(module: str, parts: set[str] | dict[str, str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in parts)


def _part(module: str) -> str:
    return max((p for p in ALLOWED if module == p or module.startswith(p + ".")), key=len)


def _all_imports(path: Path) -> set[str]:
    """Every module an ``import`` names, at any depth, third-party ones included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{a.name}" for a in node.names)
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _imports(path: Path) -> set[str]:
    """The project's modules (or names in them) an ``import`` names: ``from a import b`` is
    ``a.b``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.split(".")[0] in ("pipeline", "producers")}


def _modules() -> list[tuple[str, Path]]:
    out = []
    for folder in ("pipeline", "producers"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(
                ".__init__"
            )
            out.append((module, path))
    return out


def _calls(path: Path) -> list[tuple[str, ast.Call]]:
    """Each call's dotted callee (``config.settings``, ``os.environ.get``) and the call."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            out.append((ast.unparse(node.func), node))
    return out


def test_no_stage_imports_a_stage_above_it() -> None:
    wrong = []
    for module, path in _modules():
        if module in ("pipeline", "pipeline.__main__"):
            continue  # the package's root re-exports errors; ``python -m pipeline`` runs the CLI
        part = _part(module)
        for imported in _imports(path):
            ok = _part(imported) == part or _within(imported, ALLOWED[part])
            if not ok or (imported.startswith("pipeline.cli") and part != "pipeline.cli"):
                wrong.append(f"{module} imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_the_check_itself_sees_imports() -> None:
    modules = dict(_modules())
    assert "pipeline.ingest.microbatch" in _imports(modules["pipeline.jobs.online"])
    assert "pipeline.train.driver.TrainDriver" in _imports(modules["pipeline.jobs.trainer"])
    assert _part("pipeline.train.ps.server") == "pipeline.train"
    assert ("config.settings", "pipeline.jobs.online") in {
        (c, m) for m, p in _modules() for c, _ in _calls(p)
    }


def test_only_the_config_module_reads_the_environment() -> None:
    wrong = []
    for module, path in _modules():
        if module in READS_ENVIRONMENT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            called = isinstance(node, ast.Call) and ast.unparse(node.func) in (
                "os.getenv",
                "os.environ.get",
            )
            indexed = (
                isinstance(node, ast.Subscript)
                and isinstance(node.ctx, ast.Load)
                and ast.unparse(node.value) == "os.environ"
            )
            if called or indexed:
                wrong.append(f"{module}:{getattr(node, 'lineno', 0)} {ast.unparse(node)}")
            elif isinstance(node, ast.keyword) and node.arg in ("envvar", "auto_envvar_prefix"):
                wrong.append(
                    f"{module}:{node.value.lineno} click reads {ast.unparse(node.value)} itself"
                )
    assert not wrong, "\n".join(wrong)


def test_settings_are_read_at_the_edges_only() -> None:
    wrong = [
        f"{module}:{call.lineno}"
        for module, path in _modules()
        if not _within(module, READS_SETTINGS) and module != "pipeline.config"
        for callee, call in _calls(path)
        if callee.endswith("settings") and callee in ("config.settings", "settings")
    ]
    assert not wrong, (
        "config.settings() below the edge (pass a keyword argument instead):\n" + "\n".join(wrong)
    )


def test_no_module_over_400_lines_and_no_class_over_250() -> None:
    wrong = []
    for module, path in _modules():
        text = path.read_text()
        if text.count("\n") > MAX_MODULE_LINES:
            wrong.append(f"{module}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    wrong.append(f"{module}.{node.name}: {lines} lines")
    assert not wrong, "split by concept:\n" + "\n".join(wrong)


def _public_names(path: Path) -> tuple[list[str] | None, set[str]]:
    """A package's ``__all__``, and the names its ``__init__`` defines, imports or exports
    lazily."""
    tree = ast.parse(path.read_text())
    listed, defined = None, set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == "__all__":
                    listed = list(ast.literal_eval(node.value))
                elif isinstance(target, ast.Name) and target.id == "_EXPORTS":
                    defined.update(ast.literal_eval(node.value))
                elif isinstance(target, ast.Name):
                    defined.add(target.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
    return listed, defined


def test_every_package_re_exports_its_public_names() -> None:
    wrong = []
    for module, path in _modules():
        if path.name != "__init__.py":
            continue
        listed, defined = _public_names(path)
        if listed is None:
            wrong.append(f"{module}: no __all__")
        else:
            wrong.extend(
                f"{module}: {name} in __all__ but not defined"
                for name in listed
                if name not in defined
            )
    assert not wrong, "\n".join(wrong)


def test_no_lazy_export_is_shadowed_by_a_module_of_the_same_name() -> None:
    # Importing ``pkg.name`` binds the module as the package's attribute ``name``, and a
    # lazy ``__getattr__`` is never asked again: ``pkg.name(...)`` then calls a module.
    wrong = []
    for module, path in _modules():
        if path.name == "__init__.py":
            lazy = _lazy_exports(path)
            wrong.extend(
                f"{module}.{name}"
                for name in lazy
                if (path.parent / f"{name}.py").is_file()
                or (path.parent / name / "__init__.py").is_file()
            )
    assert not wrong, "lazy exports named like a module beside them: " + ", ".join(wrong)


def _lazy_exports(path: Path) -> set[str]:
    """The names a package's ``__init__`` looks up lazily (its ``_EXPORTS``)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in node.targets
        ):
            return set(ast.literal_eval(node.value))
    return set()


def test_importing_a_package_starts_neither_spark_nor_tensorflow() -> None:
    packages = [m for m, p in _modules() if p.name == "__init__.py"]
    script = (
        f"import sys\nfor p in {packages!r}: __import__(p)\n"
        "print(sorted(m for m in ('pyspark', 'tensorflow', 'keras') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout


def test_tensorflow_is_imported_only_where_executors_and_children_run() -> None:
    wrong = [
        f"{module} imports {m}"
        for module, path in _modules()
        if module not in TENSORFLOW_MODULES
        for m in _all_imports(path)
        if m.split(".")[0] in ("tensorflow", "keras")
    ]
    assert not wrong, "\n".join(wrong)


def test_producers_and_the_parameter_server_know_neither_spark_nor_tensorflow() -> None:
    wrong = [
        f"{module} imports {m}"
        for module, path in _modules()
        if module.startswith("producers") or _within(module, {"pipeline.train.ps"})
        for m in _all_imports(path)
        if m.split(".")[0] in ("pyspark", "tensorflow", "keras")
    ]
    wrong += [
        f"{module} imports {m}"
        for module, path in _modules()
        if _within(module, {"pipeline.train.ps"})
        for m in _imports(path)
        if not _within(m, {"pipeline.train.ps", "pipeline.errors"})
    ]
    assert not wrong, "\n".join(wrong)


def test_loggers_are_named_after_their_module() -> None:
    wrong = []
    for module, path in _modules():
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "logging.getLogger"
                and ast.unparse(node.value) != "logging.getLogger(__name__)"
            ):
                wrong.append(f"{module}: {ast.unparse(node)}")
    assert not wrong, "\n".join(wrong)


def test_metrics_are_declared_in_one_module() -> None:
    declared = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
    wrong = [
        f"{module} imports {m}"
        for module, path in _modules()
        if not _within(module, {"pipeline.observe.metrics"})  # the package and its modules
        for m in _all_imports(path)
        if m.startswith("prometheus_client.") and m.split(".")[-1] in declared
    ]
    assert not wrong, "\n".join(wrong)


def test_only_the_train_driver_saves_the_checkpoint() -> None:
    wrong = [
        f"{module}:{call.lineno}"
        for module, path in _modules()
        if module != "pipeline.train.driver"
        for callee, call in _calls(path)
        if callee == "checkpoint.save"
    ]
    assert not wrong, "the exactly-once protocol lives in pipeline/train/driver.py:\n" + "\n".join(
        wrong
    )


def test_a_batch_s_figures_are_typed_from_task_to_report() -> None:
    from pipeline.jobs.report import RunReport
    from pipeline.train.partition import TaskResult
    from pipeline.train.rows import BatchRow, TaskRow

    wrong = [
        f"{cls.__name__}.{f.name}: {f.type}"
        for cls in (TaskResult, TaskRow, BatchRow)
        for f in dataclasses.fields(cls)
        if "Any" in str(f.type)
    ]
    assert not wrong, "string-keyed dicts or Any where a dataclass belongs:\n" + "\n".join(wrong)
    assert {f.name: str(f.type) for f in dataclasses.fields(BatchRow)}["tasks"] == "list[TaskRow]"
    assert {f.name: str(f.type) for f in dataclasses.fields(RunReport)}[
        "batches"
    ] == "list[BatchRow]"


def test_kafka_clients_are_built_in_one_module() -> None:
    """Every client is secured the same way only if one module builds them all (issue 38)."""
    clients = {
        "KafkaProducer",
        "KafkaConsumer",
        "KafkaAdminClient",
        "Producer",
        "Consumer",
        "AdminClient",
    }
    wrong = [
        f"{module}:{call.lineno}: {callee}"
        for module, path in _modules()
        if module != "pipeline.ingest.kafka.client"
        for callee, call in _calls(path)
        if callee.rpartition(".")[2] in clients
    ]
    assert not wrong, "build Kafka clients with pipeline.ingest.kafka.client:\n" + "\n".join(wrong)
    sockets = [
        module
        for module, path in _modules()
        if "socket.create_connection" in path.read_text()
        and module.startswith("pipeline.ingest.kafka")
        and module not in ("pipeline.ingest.kafka.wire", "pipeline.ingest.kafka.broker")
    ]
    assert not sockets, (
        f"Kafka connections are opened by pipeline.ingest.kafka.wire alone: {sockets}"
    )


def _ruff() -> str:
    """The virtual environment's ruff (the version pyproject.toml pins), else one on PATH."""
    beside = Path(sys.executable).parent / "ruff"
    found = str(beside) if beside.is_file() else shutil.which("ruff")
    if found is None:
        pytest.skip("ruff is not installed: pip install -e '.[dev]'")
    return found


def _run_ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_ruff(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_the_tree_is_formatted_and_lints_clean() -> None:
    formatted = _run_ruff("format", "--check", ".")
    assert formatted.returncode == 0, (
        "run `.venv/bin/ruff format .`:\n" + formatted.stdout + formatted.stderr
    )
    linted = _run_ruff("check", ".")
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_the_format_check_sees_a_badly_formatted_file(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "packed.py").write_text("x = {  'a':1 }\n")
    formatted = _run_ruff("format", "--check", ".", cwd=tmp_path)
    assert formatted.returncode == 1 and "packed.py" in formatted.stdout, formatted.stdout
    (tmp_path / "long.py").write_text(f"x = {'1 + ' * 40}1\n")
    linted = _run_ruff("check", "--no-cache", "long.py", cwd=tmp_path)
    assert linted.returncode == 1 and "E501" in linted.stdout, linted.stdout
