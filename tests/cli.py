"""The CLI called in this process, as a test calls it: its exit status, not SystemExit."""

from __future__ import annotations


def exit_code(*args: str) -> int:
    """Run ``streamtrain ARGS...`` here; return its exit status (0 when it returns)."""
    from pipeline.cli import main

    try:
        main(list(args))
    except SystemExit as e:
        return int(e.code or 0)
    return 0
