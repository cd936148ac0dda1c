"""The map of what the suite proves (tests/SCENARIOS.txt) is current, and no scenario left it
without a new home."""

from __future__ import annotations

from tests import scenarios


def test_the_committed_map_is_the_generated_one() -> None:
    """Proves: tests/SCENARIOS.txt lists every test as it is now; a test added, folded or
    changed without regenerating the map fails here, with the command that regenerates it."""
    assert scenarios.MAP.read_text() == scenarios.render(scenarios.collect()), (
        "tests/SCENARIOS.txt is stale: run `.venv/bin/python -m tests.scenarios --write` and "
        "read the diff: a scenario that leaves the map needs a home in scenarios.MOVED"
    )


def test_every_moved_scenario_has_a_living_home() -> None:
    """Proves: a scenario folded into another test names a test that exists, and is no
    longer a test of its own."""
    ids = {s.id for s in scenarios.collect()}
    for old, new in scenarios.MOVED.items():
        assert old not in ids, f"{old} is in MOVED but still a test"
        assert new in ids, f"{old} moved to {new}, which is no test"
