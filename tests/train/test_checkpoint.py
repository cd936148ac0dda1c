"""The checkpoint file: a round trip, and a write that is durable once save() returns."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from pipeline.train import checkpoint


def test_round_trip(tmp_path: Path) -> None:
    state = checkpoint.State(
        np.arange(5, dtype=np.float32),
        clock=7,
        last_batch_id=3,
        ledger=[[3, "t", 0, 0, 10]],
        extra={"trained": 10},
        optimizer={"m": np.ones(5, np.float32)},
    )
    checkpoint.save(tmp_path, state)
    back = checkpoint.load(tmp_path)
    assert (
        back is not None
        and back.clock == 7
        and back.last_batch_id == 3
        and back.ledger == state.ledger
    )
    np.testing.assert_array_equal(back.weights, state.weights)
    np.testing.assert_array_equal(back.optimizer["m"], state.optimizer["m"])


def test_save_syncs_the_file_and_then_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proves: the rename is made durable (the folder is fsynced after it), so a power cut
    after Spark's commit cannot bring back the previous checkpoint."""
    synced: list[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append("folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    checkpoint.save(tmp_path, checkpoint.State(np.zeros(3, np.float32)))
    assert synced == ["file", "folder"]
    assert not list(tmp_path.glob(".*.tmp"))
