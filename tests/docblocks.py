"""The fenced blocks of the README and the guides under docs/, and how each is marked: the one
reader every test that runs a guide's commands as written goes through.

A block is marked by an HTML comment on the line just above its opening fence:
``<!-- run: tests/jobs/test_own_data.py -->`` (that test runs the block's commands as written,
reading them with :func:`run_block`) or ``<!-- illustrative -->`` (a sketch no test runs).
``tests/test_docs.py`` fails on a command block that is neither, and on a run marker whose test
does not read its block through :func:`run_block`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Info strings of blocks that hold commands for a shell.
SHELL = frozenset({"bash", "sh", "shell", "console", "zsh"})
#: The first line of an untagged block that holds commands.
_COMMAND = re.compile(
    r"^(\$ |streamtrain\b|curl\b|docker\b|bash\b|python3?\b|pip\b|\.venv/|export\b|chmod\b"
    r"|sudo\b|git\b|[A-Z][A-Z0-9_]*=\S*\s)"
)
_MARKER = re.compile(r"^<!--\s*(run:\s*(?P<test>\S+)|(?P<illustrative>illustrative))\s*-->\s*$")
_FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<info>[^`\s]*)")


@dataclass(frozen=True)
class Block:
    """One fenced block of a document.

    Args:
        doc: the document's path from the repository root (``"docs/cluster.md"``).
        line: the 1-based line of its opening fence.
        info: its info string (``"bash"``, ``"text"``; ``""`` when untagged).
        text: what lies between the fences.
        marker: the comment line just above the fence, if it is a marker: ``"run: PATH"`` or
            ``"illustrative"``; else None (an unknown comment there is kept as is, to be refused).
    """

    doc: str
    line: int
    info: str
    text: str
    marker: str | None

    @property
    def run_by(self) -> str | None:
        """The test (a path from the root) that runs this block as written, if marked so."""
        match = _MARKER.match(f"<!-- {self.marker} -->") if self.marker else None
        return match.group("test") if match else None

    @property
    def illustrative(self) -> bool:
        return self.marker == "illustrative"

    @property
    def holds_commands(self) -> bool:
        """Whether this is a command block: tagged as a shell's, or untagged with a command
        first."""
        if self.info in SHELL:
            return True
        first = next(
            (line for line in self.text.splitlines() if line.strip() and not line.startswith("#")),
            "",
        )
        return self.info == "" and bool(_COMMAND.match(first))


def documents() -> list[str]:
    """The README and every guide under docs/, as paths from the root."""
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def blocks(doc: str) -> list[Block]:
    """Every fenced block of ``doc`` (a path from the root), in order."""
    lines = (ROOT / doc).read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        fence = opening.group("fence")
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence)), len(lines))
        above = lines[i - 1].strip() if i else ""
        marker = None
        if above.startswith("<!--"):
            match = _MARKER.match(above)
            marker = (
                (f"run: {match.group('test')}" if match.group("test") else "illustrative")
                if match
                else above
            )
        found.append(
            Block(doc, i + 1, opening.group("info"), "\n".join(lines[i + 1 : end]), marker)
        )
        i = end + 1
    return found


def run_block(doc: str, test_file: str | Path) -> Block:
    """The one block of ``doc`` marked as run by ``test_file`` (a test passes its ``__file__``).

    Raises:
        LookupError: when ``doc`` marks no block, or more than one, as run by that test.
    """
    test = Path(test_file).resolve().relative_to(ROOT).as_posix()
    mine = [b for b in blocks(doc) if b.run_by == test]
    if len(mine) != 1:
        raise LookupError(
            f"Expected one block of {doc} marked <!-- run: {test} -->, found {len(mine)}."
        )
    return mine[0]


def commands(block: Block) -> list[str]:
    """A block's commands: continuation lines joined, blank and comment lines left out, and a
    comment after a command (two spaces, then ``#``) cut off.

    Example:
        >>> text = "# a comment\\nstreamtrain run \\\\\\n    --workers 8  # all\\n"
        >>> b = Block("x.md", 1, "bash", text, None)
        >>> commands(b)
        ['streamtrain run --workers 8']
    """
    joined = re.sub(r"[ \t]*\\\n\s*", " ", block.text)
    lines = (line.split("  #", 1)[0].strip() for line in joined.splitlines())
    return [line for line in lines if line and not line.startswith("#")]
