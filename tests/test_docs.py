"""The README and the guides stay true: the README stays short and leads to the guides, every
command block is run as written by a test or marked illustrative, every benchmark figure names
its benchmark and commit, and every link between the pages lands."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import docblocks

ROOT = docblocks.ROOT
#: Pages another branch brings (linked from the index before it lands): a link to one is
#: excused only while the page is absent.
PENDING: set[str] = set()  # pages linked before they are written (none now)
#: A benchmark's last line: its name (a module of bench/), then key=value figures.
BENCHES = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_"))
_FIGURE = re.compile(rf"^({'|'.join(map(re.escape, BENCHES))}) [a-z0-9_]+=\S+")
_SOURCE = re.compile(
    r"bench/(?P<bench>[a-z0-9_]+)\.py\b.*?\b(?:at|commit) (?P<commit>[0-9a-f]{7,40})\b", re.S
)
_LINK = re.compile(r"\]\((?!https?:|mailto:)(?P<path>[^)#\s]*)(?:#(?P<anchor>[^)\s]+))?\)")
#: Commands in an indented (not fenced) code block, which no marker can mark.
_INDENTED_COMMAND = re.compile(r"^ {4,}(streamtrain |\.venv/|curl |docker |bash |python3? )")


def _blocks() -> list[docblocks.Block]:
    return [b for doc in docblocks.documents() for b in docblocks.blocks(doc)]


def test_the_readme_stays_under_200_lines_and_leads_to_the_guides_in_one_click() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, (
        f"README.md has {len(readme.splitlines())} lines; move a subject to docs/"
    )
    for target in ("#quickstart", "docs/own-data.md", "docs/cluster.md", "docs/README.md"):
        assert f"]({target})" in readme, f"the README links to {target} no more"
    assert "## Quickstart" in readme


def test_every_command_block_is_run_by_a_test_or_marked_illustrative() -> None:
    unmarked = [f"{b.doc}:{b.line}" for b in _blocks() if b.holds_commands and b.marker is None]
    assert not unmarked, (
        f"command blocks neither run by a test nor marked: {unmarked}; put "
        "<!-- run: tests/PATH.py --> or <!-- illustrative --> on the line above each"
    )
    unknown = [
        f"{b.doc}:{b.line}: {b.marker}"
        for b in _blocks()
        if b.marker and not (b.run_by or b.illustrative)
    ]
    assert not unknown, f"markers that are neither run: nor illustrative: {unknown}"


def test_every_run_marker_names_a_test_that_reads_its_block() -> None:
    marked = [b for b in _blocks() if b.run_by]
    assert {b.run_by for b in marked} >= {
        "tests/jobs/test_quickstart.py",
        "tests/jobs/test_own_data.py",
        "tests/jobs/test_secure_run.py",
        "tests/cluster/test_cluster_guide.py",
    }
    for block in marked:
        test = ROOT / str(block.run_by)
        assert test.is_file() and test.name.startswith("test_"), (
            f"{block.doc}:{block.line}: no test {block.run_by}"
        )
        source = test.read_text()
        assert f'docblocks.run_block("{block.doc}", __file__)' in source, (
            f"{block.run_by} does not read {block.doc}:{block.line} through docblocks.run_block"
        )
        assert docblocks.run_block(block.doc, test) == block and docblocks.commands(block)


def test_no_indented_code_block_holds_commands() -> None:
    for doc in docblocks.documents():
        fenced = {
            line
            for b in docblocks.blocks(doc)
            for line in range(b.line, b.line + len(b.text.splitlines()) + 2)
        }
        lines = (ROOT / doc).read_text().splitlines()
        found = [
            f"{doc}:{i}"
            for i, line in enumerate(lines, 1)
            if i not in fenced and _INDENTED_COMMAND.match(line)
        ]
        assert not found, f"commands in an indented block (fence and mark them): {found}"


def _known_commit(commit: str) -> bool:
    done = subprocess.run(
        ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True
    )
    return done.returncode == 0


def _figures() -> list[tuple[str, str, str]]:
    """(where, the figure's benchmark, the text that must name its benchmark and commit) for
    every benchmark last line: in a fenced block, the comment line above it; in prose, the
    paragraph holding it."""
    found = []
    for doc in docblocks.documents():
        for b in docblocks.blocks(doc):
            comment = ""
            for i, line in enumerate(b.text.splitlines()):
                if line.startswith("#"):
                    comment = line
                elif _FIGURE.match(line):
                    found.append((f"{doc}:{b.line + 1 + i}", line.split()[0], comment))
                    comment = ""
        fences = re.sub(r"^```.*?^```", "", (ROOT / doc).read_text(), flags=re.S | re.M)
        for paragraph in fences.split("\n\n"):
            for code in re.findall(r"`([^`]+)`", paragraph):
                if _FIGURE.match(code):
                    found.append((f"{doc}: `{code[:40]}...`", code.split()[0], paragraph))
    return found


@pytest.mark.skipif(
    shutil.which("git") is None or not (ROOT / ".git").exists(), reason="no git history here"
)
def test_every_benchmark_figure_names_its_benchmark_and_a_commit_of_the_history() -> None:
    figures = _figures()
    assert len(figures) >= 10, figures  # the performance guide's last lines are found
    for where, bench, source in figures:
        named = _SOURCE.search(source)
        assert named, (
            f"{where}: name bench/{bench}.py and its commit (`# bench/{bench}.py, measured at "
            "ABC1234`)"
        )
        assert named.group("bench") == bench, (
            f"{where}: a {bench} figure credited to bench/{named.group('bench')}.py"
        )
        assert _known_commit(named.group("commit")), (
            f"{where}: commit {named.group('commit')} is not in the history"
        )


def _slugs(doc: Path) -> set[str]:
    """The anchors GitHub gives a page's headings."""
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
    return {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#{1,6} (.+)$", text, re.M)
    }


def test_every_link_between_the_pages_lands() -> None:
    broken = []
    for doc in docblocks.documents():
        page = ROOT / doc
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
        for link in _LINK.finditer(text):
            target = (page.parent / link.group("path")).resolve() if link.group("path") else page
            relative = (
                target.relative_to(ROOT).as_posix() if target.is_relative_to(ROOT) else str(target)
            )
            if not target.exists():
                if relative not in PENDING:
                    broken.append(f"{doc}: {link.group(0)}")
            elif (
                link.group("anchor")
                and target.suffix == ".md"
                and link.group("anchor") not in _slugs(target)
            ):
                broken.append(f"{doc}: {link.group(0)} (no such heading)")
    assert not broken, broken


def test_every_file_the_pages_name_exists() -> None:
    """A guide that names `tests/jobs/test_run.py` or `pipeline/codec.py` names a file that is
    there."""
    named = {
        (doc, path)
        for doc in docblocks.documents()
        for path in re.findall(
            r"\b((?:tests|bench|pipeline|producers|deploy|dashboards|docs)/[a-z0-9_./-]+"
            r"\.(?:py|yml|yaml|json|md))\b",
            (ROOT / doc).read_text(),
        )
    }
    assert len(named) > 20, named
    missing = sorted(
        f"{doc}: {path}"
        for doc, path in named
        if not (ROOT / path).exists() and path not in PENDING
    )
    assert not missing, missing


def test_the_reader_finds_each_tests_commands() -> None:
    """The blocks the slow tests run, read here in a second: each is the commands it should be."""
    quick = docblocks.commands(
        docblocks.run_block("README.md", ROOT / "tests/jobs/test_quickstart.py")
    )
    assert quick == [
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/streamtrain run",
        "bash tests/run.sh",
    ]
    own = docblocks.commands(
        docblocks.run_block("docs/own-data.md", ROOT / "tests/jobs/test_own_data.py")
    )
    assert [c.split()[:3] for c in own[:4]] == [
        ["streamtrain", "data", "sample"],
        ["streamtrain", "schema", "infer"],
        ["streamtrain", "run", "--data"],
        ["streamtrain", "serve", "runs/penguins"],
    ]
    assert own[4].startswith("curl ") and len(own) == 5
    kafka = docblocks.commands(
        docblocks.run_block("docs/kafka.md", ROOT / "tests/jobs/test_secure_run.py")
    )
    assert [c.split()[:2] for c in kafka] == [
        ["chmod", "600"],
        ["streamtrain", "produce"],
        ["streamtrain", "run"],
    ]
    cluster = docblocks.commands(
        docblocks.run_block("docs/cluster.md", ROOT / "tests/cluster/test_cluster_guide.py")
    )
    assert cluster[0] == "export PATH=/opt/streamtrain/bin:$PATH" and len(cluster) == 7
    assert cluster[-1].startswith("SPARK_LOCAL_IP=10.0.0.1 ") and cluster[-1].endswith(
        "--workers 8"
    )


def test_every_properties_block_reads_as_it_means(tmp_path: Path) -> None:
    """Proves: each ``properties`` block of the docs, saved as a user saves it, reads with the
    project's reader into settings whose values hold no comment: Java's ``Properties`` and
    librdkafka take a ``#`` after a value as part of it, so a file copied from the docs with
    one would send the comment as the broker's address or the mechanism."""
    from pipeline.ingest.kafka import conf

    found = [b for b in _blocks() if b.info == "properties"]
    assert found, "no properties block in the docs: the check has nothing to read"
    for block in found:
        saved = tmp_path / "client.properties"
        saved.write_text(block.text + "\n")
        settings = conf.read_properties(saved)
        assert settings, f"{block.doc}:{block.line}: no setting read"
        commented = {k: v for k, v in settings.items() if "#" in v}
        assert not commented, f"{block.doc}:{block.line}: a comment after a value: {commented}"
