"""The map of what the suite proves: every test, by id, with what it claims and asserts.

Generated from the test files' syntax (no import, no collection), each check as its source
text (not ``ast.unparse``, whose quoting changes between Pythons), so it is the same on every
machine and quick to check. ``tests/SCENARIOS.txt`` holds it; ``tests/test_scenarios.py``
fails when the file is stale, and when a scenario leaves the map without a new home in
``MOVED``: a test folded into another one that starts the same services keeps its checks,
and the map says where they went.

Regenerate after changing tests: ``.venv/bin/python -m tests.scenarios --write``.

Example:
    >>> source = '''
    ... def test_adds():
    ...     "One and one make two."
    ...     assert 1 + 1 == 2  # arithmetic
    ... '''
    >>> [s.claim for s in scenarios_of(source, "tests/test_x.py")]
    ['One and one make two.']
    >>> scenarios_of(source, "tests/test_x.py")[0].checks
    ('assert 1 + 1 == 2',)
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAP = ROOT / "tests" / "SCENARIOS.txt"

#: Scenarios whose test was folded into another: old id -> the id that now checks it.
#: The new test's docstring names the step that carries each old scenario.
MOVED: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One test: its id, its marks, its claim (the docstring's first sentence) and checks."""

    id: str
    slow: bool
    parametrized: bool
    claim: str
    checks: tuple[str, ...]

    def lines(self) -> list[str]:
        tags = [t for t, on in (("slow", self.slow), ("parametrized", self.parametrized)) if on]
        head = self.id + (f"  [{', '.join(tags)}]" if tags else "")
        return [head, f"  claim: {self.claim}"] + [f"  {c}" for c in self.checks]


def _marks(node: ast.AST) -> set[str]:
    """The pytest marks a decorator list or a ``pytestmark`` value names."""
    found = set()
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Attribute)
            and isinstance(sub.value.value, ast.Name)
            and sub.value.value.id == "pytest"
            and sub.value.attr == "mark"
        ):
            found.add(sub.attr)
    return found


def _module_marks(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return _marks(node.value)
    return set()


def _claim(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    doc = ast.get_docstring(fn)
    if not doc:
        return fn.name.removeprefix("test_").replace("_", " ")
    text = " ".join(doc.split())
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _checks(fn: ast.AST, helpers: dict[str, int], source: str) -> tuple[str, ...]:
    """The test's own asserts, what it expects to raise or fail, and the project helpers with
    asserts of their own that it calls (their checks count as the test's)."""
    out: list[str] = []
    called: list[str] = []
    for sub in ast.walk(fn):
        if isinstance(sub, ast.Assert):
            out.append("assert " + _short(ast.get_source_segment(source, sub.test) or ""))
        elif isinstance(sub, ast.Call):
            name = ast.get_source_segment(source, sub.func) or ""
            if name in ("pytest.raises", "pytest.fail", "pytest.xfail", "pytest.skip"):
                args = ", ".join(ast.get_source_segment(source, a) or "" for a in sub.args[:1])
                out.append(f"{name.removeprefix('pytest.')} {_short(args, 80)}".rstrip())
            elif name in helpers and name not in called:
                called.append(name)
    out += [f"via {name} ({helpers[name]} asserts)" for name in called]
    return tuple(out)


def _helpers(tree: ast.Module) -> dict[str, int]:
    """Module-level functions (not tests) that assert: name -> how many asserts."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("test_"):
            n = sum(isinstance(s, ast.Assert) for s in ast.walk(node))
            if n:
                found[node.name] = n
    return found


def scenarios_of(source: str, path: str) -> list[Scenario]:
    """Every test function of one test module's source, in file order."""
    tree = ast.parse(source, path)
    module_slow = "slow" in _module_marks(tree)
    helpers = _helpers(tree)

    def walk(body: list[ast.stmt], prefix: str, slow: bool) -> Iterator[Scenario]:
        for node in body:
            if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                yield from walk(node.body, f"{prefix}::{node.name}", slow or "slow" in _marks(node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not node.name.startswith("test_"):
                    continue
                marks = set()
                for d in node.decorator_list:
                    marks |= _marks(d)
                yield Scenario(
                    id=f"{prefix}::{node.name}",
                    slow=slow or "slow" in marks,
                    parametrized="parametrize" in marks,
                    claim=_claim(node),
                    checks=_checks(node, helpers, source),
                )

    return list(walk(tree.body, path, module_slow))


def collect(root: Path = ROOT) -> list[Scenario]:
    """Every scenario under tests/, by path."""
    found: list[Scenario] = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        rel = path.relative_to(root).as_posix()
        found += scenarios_of(path.read_text(), rel)
    return found


def render(found: list[Scenario]) -> str:
    slow = sum(s.slow for s in found)
    checks = sum(len(s.checks) for s in found)
    head = [
        "# What the suite proves: every test by id, its claim and its checks.",
        "# Generated by `python -m tests.scenarios --write`; do not edit by hand.",
        f"# {len(found)} scenarios ({slow} slow), {checks} checks, "
        f"{len(MOVED)} moved into other tests",
        "",
    ]
    body = [line for s in found for line in [*s.lines(), ""]]
    moved = [f"moved: {old} -> {new}" for old, new in sorted(MOVED.items())]
    return "\n".join(head + body + moved).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = render(collect())
    if argv[1:] == ["--write"]:
        MAP.write_text(text)
        print(text.splitlines()[2].removeprefix("# "))
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
