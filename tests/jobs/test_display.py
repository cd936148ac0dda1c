"""The run's display and its start-up figure (issue 29): `report.json`'s `startup_s` is what the
README calls start-up, from the launch to the first trained batch."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from pipeline.ingest.microbatch import BatchFigures
from pipeline.jobs.display import Display
from pipeline.jobs.report import History
from pipeline.train.rows import BatchRow


class _Metrics:
    def on_batch(self, info: Any, row: Any) -> None:
        pass


def test_startup_ends_when_the_first_batch_is_trained_not_when_it_reached_the_driver() -> None:
    launched = time.monotonic() - 10.0
    history = History()
    display = Display(history=history, metrics=_Metrics(), eval_every=1000, until_accuracy=None,  # type: ignore[arg-type]
                      started=launched)
    assert history.startup_s(launched) is None  # no batch trained yet
    # The batch reached the driver 4 s after the launch (as the workers finished warming up)
    # and was trained by now, 10 s after it.
    first = BatchFigures(batch_id=0, ranges=[], rows=10, started_at=launched + 4.0)
    display.on_row(first, BatchRow(0, 10.0, 10, 10, {}, 6.0, 0, None, None, 1, 5.0, 0.1), np.zeros(1, np.float32))
    startup = history.startup_s(launched)
    assert startup is not None and 10.0 <= startup < 11.0
    display.on_row(BatchFigures(batch_id=1, ranges=[], rows=10, started_at=launched + 11.0),
                   BatchRow(1, 12.0, 10, 10, {}, 1.0, 0, None, None, 2, 0.9, 0.1), np.zeros(1, np.float32))
    assert history.startup_s(launched) == startup  # the first batch's, once
