"""What a run sets aside (issue 41, item 1): the rows its replay could not send and the records
the stream rejected are counted together, on /metrics as they come, and a share past
--max-rejected stops the run in one line naming the reasons and the first rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ConfigError, DataError
from pipeline.jobs.online import Run
from pipeline.jobs.run_config import RunConfig
from producers.datasets.table import SAMPLES
from producers.report import MalformedSoFar

PENGUINS = SAMPLES / "penguins" / "penguins.csv"


class _Replay:
    """A replay still sending, that has set ``malformed`` rows aside."""

    sent = None

    def __init__(self, malformed: MalformedSoFar) -> None:
        self.malformed = malformed

    def done(self) -> bool:
        return False


def _rejected(run: Run, reason: str) -> float:
    for metric in run.metrics.meters.registry.collect():
        for s in metric.samples:
            if (
                s.name == "streamtrain_stream_records_rejected_total"
                and s.labels.get("reason") == reason
            ):
                return float(s.value)
    return 0.0


@pytest.mark.parametrize("limit, stops", [(None, True), (0.5, False)])
def test_the_replays_rows_set_aside_are_counted_and_stop_the_run_past_the_limit(
    tmp_path: Path, limit: float | None, stops: bool
) -> None:
    run = Run(
        RunConfig(data=str(PENGUINS), label="species", out=str(tmp_path / "r"), max_rejected=limit)
    )
    run.replay = _Replay(
        MalformedSoFar(
            1000,
            400,
            {"not_a_number:bill_length_mm": 400},  # type: ignore[assignment]
            [(7, "not_a_number:bill_length_mm")],
        )
    )
    run.display.rejects.add_stream({}, trained=600)
    assert run._until() is stops
    assert _rejected(run, "not_a_number:bill_length_mm") == 400  # on /metrics as it happens
    assert run.display.rejects.line() == "rejected 400 (40%: not_a_number:bill_length_mm 400)"
    if stops:
        assert isinstance(run.end.failure, DataError)
        assert str(run.end.failure) == (
            "Expected at most 10% of the records rejected (--max-rejected 0.1). Received: 400 of "
            "1,000 (not_a_number:bill_length_mm 400; line 7: not_a_number:bill_length_mm). Fix "
            "the data or the schema, or raise --max-rejected."
        )
    run._until()  # the same tally again counts nothing twice
    assert _rejected(run, "not_a_number:bill_length_mm") == 400


def test_max_rejected_outside_0_1_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"Expected --max-rejected in \[0, 1\]"):
        RunConfig(data=str(PENGUINS), label="species", max_rejected=5).validate()
