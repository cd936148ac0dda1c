"""The click stream's generative model: a function of the index and the seed, Zipf-popular
IDs that renew, and a best score computed from its true probabilities."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import ConfigError
from producers.datasets.clicks import ClickModel


def test_any_stretch_is_the_same_alone_or_within_a_longer_one() -> None:
    model = ClickModel(users=50_000, items=10_000, seed=3)
    whole = model.sample(0, 1_000)
    parts = [model.sample(0, 400), model.sample(400, 600)]
    for field in ("user_id", "item_id", "x", "label", "p"):
        joined = np.concatenate([getattr(p, field) for p in parts])
        assert np.array_equal(getattr(whole, field), joined), field
    assert not np.array_equal(
        ClickModel(users=50_000, items=10_000, seed=4).sample(0, 1_000).p, whole.p
    )


def test_popularity_is_zipf_like_and_ids_renew() -> None:
    """The most popular item takes about 1/ln(width) of the records (Zipf, exponent 1), and a
    stretch five million records later is mostly new IDs."""
    model = ClickModel(users=200_000, items=100_000, renewal=0.2)
    early = model.sample(0, 200_000)
    _, counts = np.unique(early.item_id, return_counts=True)
    assert 0.03 < counts.max() / len(early) < 0.12
    late = model.sample(5_000_000, 200_000)
    seen = np.isin(np.unique(late.item_id), early.item_id).mean()
    assert seen < 0.5, seen


def test_the_best_score_beats_any_constant_and_ids_carry_signal() -> None:
    """The true probabilities' logloss is well under the click rate's, and their AUC well
    over what the dense features alone give: the IDs hold signal to learn."""
    from pipeline.train.evaluation import roc_auc

    model = ClickModel(users=20_000, items=5_000)
    best = model.best(0, 50_000, auc=roc_auc)
    assert best["logloss"] < 0.85 * best["logloss_constant"], best
    clicks = model.sample(0, 50_000)
    dense_only = roc_auc(clicks.label, clicks.x @ model.weights())
    assert best["auc"] > dense_only + 0.1, (best["auc"], dense_only)


def test_bad_settings_are_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="users=0"):
        ClickModel(users=0)
    with pytest.raises(ConfigError, match="renewal=2"):
        ClickModel(renewal=2)
