"""The layering docs/architecture.md promises: each stage imports only the stages below it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: What each part may import from the project (besides itself). Lower parts never see higher ones.
ALLOWED = {
    "pipeline.errors": set(),
    "pipeline.config": {"pipeline.errors"},
    "pipeline.codec": {"pipeline.errors"},
    "pipeline.cluster": {"pipeline.errors", "pipeline.config"},
    "pipeline.observe": {"pipeline.errors", "pipeline.config"},
    "pipeline.ingest": {"pipeline.errors", "pipeline.config", "pipeline.codec", "pipeline.cluster"},
    "producers": {"pipeline.errors", "pipeline.config", "pipeline.codec", "pipeline.ingest.kafka",
                  "pipeline.observe.metrics"},
    "pipeline.train": {"pipeline.errors", "pipeline.config", "pipeline.codec", "pipeline.cluster",
                       "pipeline.ingest"},
    "pipeline.serve": {"pipeline.errors", "pipeline.config", "pipeline.codec", "pipeline.cluster",
                       "pipeline.ingest", "pipeline.train", "pipeline.observe"},
    "pipeline.jobs": {"pipeline.errors", "pipeline.config", "pipeline.codec", "pipeline.cluster",
                      "pipeline.ingest", "pipeline.train", "pipeline.observe", "pipeline.serve", "producers"},
    "pipeline.cli": {"pipeline", "producers"},  # the edge: anything but itself
}


def _part(module: str) -> str:
    return max((p for p in ALLOWED if module == p or module.startswith(p + ".")), key=len)


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
            found.update(names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.split(".")[0] in ("pipeline", "producers")}


def _modules() -> list[tuple[str, Path]]:
    out = []
    for folder in ("pipeline", "producers"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out.append((module, path))
    return out


def test_no_stage_imports_a_stage_above_it() -> None:
    wrong = []
    for module, path in _modules():
        if module in ("pipeline", "pipeline.__main__"):
            continue  # the package's root re-exports errors; ``python -m pipeline`` runs the CLI
        part = _part(module)
        for imported in _imports(path):
            ok = _part(imported) == part or any(imported == a or imported.startswith(a + ".") for a in ALLOWED[part])
            if not ok or (imported.startswith("pipeline.cli") and part != "pipeline.cli"):
                wrong.append(f"{module} imports {imported}")
    assert not wrong, "\n".join(wrong)


def test_the_check_itself_sees_imports() -> None:
    modules = dict(_modules())
    assert "pipeline.ingest.microbatch" in _imports(modules["pipeline.jobs.online"])
    assert _part("pipeline.train.ps.server") == "pipeline.train"
