"""A user's table: the schema file, inference, the one transform, and each record format
(JSON, CSV lines, Avro with its schema or in the Confluent wire format) agreeing record for
record; files (CSV with strings and gaps, JSON lines, Parquet) read alike."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline import codec
from pipeline.errors import ConfigError
from pipeline.serve import instances
from pipeline.table import TableSchema, decode, encode_rows, infer
from pipeline.table.registry import Registry, client
from pipeline.table.writers import encode_values
from producers import datasets
from producers.datasets.table import SAMPLES, held_out, sample_columns

PENGUINS = SAMPLES / "penguins" / "penguins.csv"


@pytest.fixture(scope="module")
def penguins() -> TableSchema:
    return infer(sample_columns(PENGUINS), label="species")


def test_inference_reads_strings_gaps_and_classes(penguins: TableSchema) -> None:
    kinds = {f.name: f.kind for f in penguins.features}
    assert kinds == {"island": "categorical", "bill_length_mm": "numeric", "bill_depth_mm": "numeric",
                     "flipper_length_mm": "numeric", "body_mass_g": "numeric", "sex": "categorical",
                     "year": "numeric"}
    assert penguins.label is not None and penguins.label.classes == ("Adelie", "Chinstrap", "Gentoo")
    island = next(f for f in penguins.features if f.name == "island")
    assert island.vocabulary == ("Biscoe", "Dream", "Torgersen") and penguins.width == 4 + 4 + 3 + 1  # one-hot slots include the unknown one
    # A numeric label with many values is a target; --target classes would make it classes.
    mass = infer(sample_columns(PENGUINS), label="body_mass_g")
    assert mass.regression and mass.num_classes == 0
    assert TableSchema.from_json(penguins.to_json()) == penguins


@pytest.mark.parametrize("text, message", [
    ('{"features": []}', "Expected at least one feature"),
    ('{"features": [{"name": "a", "kind": "text"}]}', "Expected kind in"),
    ('{"features": [{"name": "a", "kind": "categorical"}]}', "either a vocabulary or hash_buckets"),
    ('{"features": [{"name": "a", "colour": 1}]}', "Expected keys among"),
    ('{"features": [{"name": "a"}], "label": {"name": "a"}}', "a column that is not also a feature"),
    ('{"features": [{"name": "a"}], "format": "xml"}', "Expected one of ('json', 'csv', 'avro')"),
    ("{oops", "Expected JSON in the schema file"),
])
def test_a_bad_schema_file_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        TableSchema.load(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_json_csv_and_avro_records_decode_alike(penguins: TableSchema) -> None:
    rows = [r for _, block, _ in datasets.table.read_rows(PENGUINS) for r in block][:200]
    decoded = {}
    for fmt in ("json", "csv", "avro"):
        table = penguins.with_format(fmt)
        values = encode_values(rows, table)
        decoded[fmt] = decode(values + [b"\xff garbage"], table)
        assert decoded[fmt].rejected.tolist()[-1] == 200, fmt  # the garbage, named by its format's reason
    for fmt in ("csv", "avro"):
        assert np.array_equal(decoded[fmt].x, decoded["json"].x) and np.array_equal(decoded[fmt].y, decoded["json"].y)
    # Rows 3 (every measurement NA) and 8 (sex NA) train: gaps are filled, not fatal.
    assert len(decoded["json"].y) == 200
    gap_row = decoded["json"].x[decoded["json"].accepted.tolist().index(3)]
    assert np.isfinite(gap_row).all()


def test_rejects_name_the_field() -> None:
    table = TableSchema.from_dict({"features": [{"name": "size", "missing": "reject"},
                                                {"name": "ok", "kind": "boolean"}],
                                   "label": {"name": "kind", "classes": ["a", "b"]}})
    d = decode([b'{"size": 1, "ok": true, "kind": "a"}', b'{"ok": true, "kind": "a"}', b'{"size": "big", "kind": "a"}',
                b'{"size": 1, "ok": "maybe", "kind": "a"}', b'{"size": 1, "kind": "c"}', b'{"size": 1}',
                b'{"size": 1e39, "kind": "a"}', b"[1, 2]", b"{"], table)
    assert d.reason_names() == ["missing:size", "not_a_number:size", "not_a_boolean:ok", "unknown_class:kind",
                                "missing:kind", "non_finite:size", "not_an_object", "not_json"]
    assert d.accepted.tolist() == [0] and d.x.tolist() == [[1.0, 1.0]]


def test_confluent_wire_format_resolves_ids_through_the_registry(penguins: TableSchema) -> None:
    from confluent_kafka.schema_registry import Schema

    from pipeline.table.schema import avro_schema

    mock = client("mock://streamtrain-test")
    schema_id = mock.register_schema("penguins-value", Schema(json.dumps(avro_schema(penguins)), "AVRO"))
    registry = Registry(mock)
    table = penguins.with_format("avro", registry="mock://streamtrain-test")
    rows = [r for _, block, _ in datasets.table.read_rows(PENGUINS) for r in block][:20]
    values = encode_values(rows, table, schema_id=schema_id)
    assert values[0][:5] == b"\x00" + schema_id.to_bytes(4, "big")
    unknown = b"\x00" + (schema_id + 99).to_bytes(4, "big") + values[0][5:]
    d = decode([*values, unknown, values[0][5:]], table, registry=registry)
    assert len(d.y) == 20 and d.reason_names() == [f"unknown_schema_id:{schema_id + 99}", "not_confluent_avro"]
    plain = decode(encode_values(rows, penguins.with_format("json")), penguins)
    assert np.array_equal(d.x, plain.x)
    assert registry.latest("penguins-value") == (schema_id, avro_schema(penguins))


def test_csv_json_lines_and_parquet_files_read_alike(tmp_path: Path, penguins: TableSchema) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [r for _, block, _ in datasets.table.read_rows(PENGUINS) for r in block]
    typed = datasets.Table(PENGUINS, schema=penguins, holdout=0.0)._typed(rows)
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in typed) + "not json\n")
    pq.write_table(pa.Table.from_pylist(typed), tmp_path / "p.parquet")
    loaded = {}
    for name in ("penguins.csv", "p.jsonl", "p.parquet"):
        path = PENGUINS if name == "penguins.csv" else tmp_path / name
        data = datasets.get(path.suffix.lstrip("."), path, schema=penguins, holdout=0.0)
        loaded[name] = data.load("train")
        if name == "p.jsonl":
            assert data.malformed_examples == [(len(rows) + 1, "not_json")]
    assert len(loaded["penguins.csv"].y) == 344
    for name in ("p.jsonl", "p.parquet"):
        assert np.allclose(loaded[name].x, loaded["penguins.csv"].x) and np.array_equal(loaded[name].y, loaded["penguins.csv"].y)


def test_holdout_is_fixed_disjoint_and_spread() -> None:
    data = datasets.get("csv", PENGUINS, label="species")
    train, test = data.load("train"), data.load("test")
    assert len(train.y) + len(test.y) == 344 and not set(train.ids.tolist()) & set(test.ids.tolist())
    assert 20 <= len(test.y) <= 50 and test.ids.min() < 100 < test.ids.max()
    assert held_out(np.arange(1000, dtype=np.uint64), 0.1).tolist() == held_out(np.arange(1000, dtype=np.uint64), 0.1).tolist()
    keys = [str(i).encode() for i in range(10_000)]
    share = codec.held_out(keys, np.arange(10_000), 0.02).mean()
    assert 0.015 < share < 0.025


def test_serving_transforms_raw_instances_as_training_did(penguins: TableSchema) -> None:
    schema = codec.table("penguins", penguins.unlabelled())
    body = {"instances": [{"island": "Dream", "bill_length_mm": "45.1", "sex": None},
                          {"island": "Biscoe", "bill_length_mm": 50.5, "flipper_length_mm": 225}]}
    x, columnar = instances.parse(json.dumps(body).encode(), schema, max_instances=8)
    assert not columnar and np.allclose(x, encode_rows(body["instances"], penguins))
    with pytest.raises(instances.BadRequest, match="instance 1: not_a_number:bill_length_mm") as e:
        instances.parse(b'{"instances": [{"island": "Dream"}, {"bill_length_mm": "long"}]}', schema, max_instances=8)
    assert e.value.reason == "bad_field"
    with pytest.raises(instances.BadRequest, match="to be an object of the fields"):
        instances.parse(b'{"instances": [[1, 2, 3]]}', schema, max_instances=8)
