"""ID features in the schema: the `id` kind's round trip and refusals, the keys carried
exactly through a decoded block, and `schema infer` proposing it (issue 56)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.errors import ConfigError
from pipeline.table import TableSchema, decode, infer
from pipeline.table.ids import GAP, IdLayout, id_keys
from producers.datasets.clicks import ClickModel


def _schema(**item: object) -> dict[str, object]:
    return {
        "features": [
            {"name": "user", "kind": "id", "dim": 8, "min_count": 2, "ttl": 1000},
            {"name": "clicked_item", "kind": "id", "dim": 4, "table": "item", **item},
            {"name": "shown_item", "kind": "id", "dim": 4, "table": "item"},
            {"name": "price", "kind": "numeric"},
        ],
        "label": {"name": "clicked", "classes": ["0", "1"]},
    }


def test_an_id_schema_survives_its_file_and_lays_out_keys_then_rows() -> None:
    s = TableSchema.from_dict(_schema())
    assert TableSchema.from_json(s.to_json()) == s
    assert [f.name for f in s.ids] == ["user", "clicked_item", "shown_item"]
    assert s.width == 3 * 3 + 1 and s.model_width == 8 + 4 + 4 + 1
    layout = IdLayout(s)
    assert layout.tables() == {"user": 8, "item": 4}  # two features, one table
    values = [
        b'{"user": "alice", "clicked_item": 17, "shown_item": "17", "price": 2, "clicked": "1"}',
        b'{"user": null, "clicked_item": 99, "shown_item": 5, "price": 3, "clicked": "0"}',
    ]
    block = decode(values, s)
    assert block.x.dtype == np.float32
    users, clicked, shown = layout.keys(block.x)
    assert users.tolist() == [int(id_keys(["alice"])[0]), int(GAP)]
    assert clicked.tolist() == [17, 99] and shown.tolist() == [17, 5]  # "17" is 17
    assert block.x[:, layout.dense].tolist() == [[2.0], [3.0]]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"dim": 0}, "dim, the embedding's size"),
        ({"dim": 8}, "the settings of the other features in table 'item'"),
        ({"optimizer": "adam"}, "optimizer in ('adagrad', 'sgd')"),
        ({"ttl": 0}, "ttl, records, >= 1"),
        ({"min_count": 0}, "min_count >= 1"),
    ],
)
def test_a_wrong_id_setting_is_one_line_naming_it(change: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError, match="Expected") as e:
        TableSchema.from_dict(_schema(**change))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_dim_on_a_feature_that_is_not_an_id_is_refused() -> None:
    d = _schema()
    d["features"][3]["dim"] = 4  # type: ignore[index]
    with pytest.raises(ConfigError, match="dim and table only on a feature of kind id"):
        TableSchema.from_dict(d)


def test_schema_infer_makes_the_users_and_items_of_a_click_table_ids() -> None:
    """The issue's trial: on a 20,000-row click table, `schema infer` hashed user_id and
    item_id into 64 buckets each; they are IDs now, and the dense columns stay numeric."""
    model = ClickModel(users=50_000, items=20_000, seed=3)
    clicks = model.sample(0, 20_000)
    rows = [model.record(clicks, i) for i in range(len(clicks))]
    columns = {k: [r[k] for r in rows] for k in rows[0]}
    s = infer(columns, label="clicked")
    kinds = {f.name: f.kind for f in s.features}
    assert kinds == {
        "user_id": "id",
        "item_id": "id",
        "x0": "numeric",
        "x1": "numeric",
        "x2": "numeric",
    }
    assert json.loads(s.to_json())["features"][0]["dim"] == 16


def test_a_csv_s_decimal_columns_stay_numeric_however_many_values_they_hold() -> None:
    """A CSV's numbers are text: thousands of distinct decimals are a quantity, not IDs (they
    were once proposed as IDs, and a table of them stopped learning)."""
    rng = np.random.default_rng(0)
    columns = {
        "x0": [f"{v:.6f}" for v in rng.normal(size=2_000)],
        "user_id": [str(i) for i in rng.integers(0, 10**9, 2_000)],
        "y": [str(i % 2) for i in range(2_000)],
    }
    kinds = {f.name: f.kind for f in infer(columns, label="y").features}
    assert kinds == {"x0": "numeric", "user_id": "id"}
