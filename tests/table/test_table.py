"""A user's table: the schema file, inference, the one transform, and each record format
(JSON, CSV lines, Avro with its schema or in the Confluent wire format) agreeing record for
record; files (CSV with strings and gaps, JSON lines, Parquet) read alike."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline import codec, record_key
from pipeline.errors import ConfigError
from pipeline.serve import instances
from pipeline.table import TableSchema, decode, encode_rows, infer
from pipeline.table.registry import Registry, client
from pipeline.table.writers import encode_values
from producers import datasets
from producers.datasets import table_files
from producers.datasets.table import SAMPLES, held_out, sample_columns
from tests.cli import exit_code

PENGUINS = SAMPLES / "penguins" / "penguins.csv"


@pytest.fixture(scope="module")
def penguins() -> TableSchema:
    return infer(sample_columns(PENGUINS), label="species")


def test_inference_reads_strings_gaps_and_classes(penguins: TableSchema) -> None:
    kinds = {f.name: f.kind for f in penguins.features}
    assert kinds == {
        "island": "categorical",
        "bill_length_mm": "numeric",
        "bill_depth_mm": "numeric",
        "flipper_length_mm": "numeric",
        "body_mass_g": "numeric",
        "sex": "categorical",
        "year": "numeric",
    }
    assert penguins.label is not None and penguins.label.classes == (
        "Adelie",
        "Chinstrap",
        "Gentoo",
    )
    island = next(f for f in penguins.features if f.name == "island")
    assert (
        island.vocabulary == ("Biscoe", "Dream", "Torgersen") and penguins.width == 4 + 4 + 3 + 1
    )  # one-hot slots include the unknown one
    # A numeric label with many values is a target; --target classes would make it classes.
    mass = infer(sample_columns(PENGUINS), label="body_mass_g")
    assert mass.regression and mass.num_classes == 0
    assert TableSchema.from_json(penguins.to_json()) == penguins


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"features": []}', "Expected at least one feature"),
        ('{"features": [{"name": "a", "kind": "text"}]}', "Expected kind in"),
        (
            '{"features": [{"name": "a", "kind": "categorical"}]}',
            "either a vocabulary or hash_buckets",
        ),
        ('{"features": [{"name": "a", "colour": 1}]}', "Expected keys among"),
        (
            '{"features": [{"name": "a"}], "label": {"name": "a"}}',
            "a column that is not also a feature",
        ),
        (
            '{"features": [{"name": "a"}], "format": "xml"}',
            "Expected one of ('json', 'csv', 'avro')",
        ),
        ("{oops", "Expected JSON in the schema file"),
    ],
)
def test_a_bad_schema_file_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
        TableSchema.load(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_json_csv_and_avro_records_decode_alike(penguins: TableSchema) -> None:
    rows = [r for _, block, _ in table_files.read_rows(PENGUINS) for r in block][:200]
    decoded = {}
    for fmt in ("json", "csv", "avro"):
        table = penguins.with_format(fmt)
        values = encode_values(rows, table)
        decoded[fmt] = decode(values + [b"\xff garbage"], table)
        assert decoded[fmt].rejected.tolist()[-1] == 200, (
            fmt
        )  # the garbage, named by its format's reason
    for fmt in ("csv", "avro"):
        assert np.array_equal(decoded[fmt].x, decoded["json"].x) and np.array_equal(
            decoded[fmt].y, decoded["json"].y
        )
    # Rows 3 (every measurement NA) and 8 (sex NA) train: gaps are filled, not fatal.
    assert len(decoded["json"].y) == 200
    gap_row = decoded["json"].x[decoded["json"].accepted.tolist().index(3)]
    assert np.isfinite(gap_row).all()


def test_rejects_name_the_field() -> None:
    table = TableSchema.from_dict(
        {
            "features": [{"name": "size", "missing": "reject"}, {"name": "ok", "kind": "boolean"}],
            "label": {"name": "kind", "classes": ["a", "b"]},
        }
    )
    d = decode(
        [
            b'{"size": 1, "ok": true, "kind": "a"}',
            b'{"ok": true, "kind": "a"}',
            b'{"size": "big", "kind": "a"}',
            b'{"size": 1, "ok": "maybe", "kind": "a"}',
            b'{"size": 1, "kind": "c"}',
            b'{"size": 1}',
            b'{"size": 1e39, "kind": "a"}',
            b"[1, 2]",
            b"{",
        ],
        table,
    )
    assert d.reason_names() == [
        "missing:size",
        "not_a_number:size",
        "not_a_boolean:ok",
        "unknown_class:kind",
        "missing:kind",
        "non_finite:size",
        "not_an_object",
        "not_json",
    ]
    assert d.accepted.tolist() == [0] and d.x.tolist() == [[1.0, 1.0]]


def test_confluent_wire_format_resolves_ids_through_the_registry(penguins: TableSchema) -> None:
    from confluent_kafka.schema_registry import Schema

    from pipeline.table.schema import avro_schema

    mock = client("mock://streamtrain-test")
    schema_id = mock.register_schema(
        "penguins-value", Schema(json.dumps(avro_schema(penguins)), "AVRO")
    )
    registry = Registry(mock)
    table = penguins.with_format("avro", registry="mock://streamtrain-test")
    rows = [r for _, block, _ in table_files.read_rows(PENGUINS) for r in block][:20]
    values = encode_values(rows, table, schema_id=schema_id)
    assert values[0][:5] == b"\x00" + schema_id.to_bytes(4, "big")
    unknown = b"\x00" + (schema_id + 99).to_bytes(4, "big") + values[0][5:]
    d = decode([*values, unknown, values[0][5:]], table, registry=registry)
    assert len(d.y) == 20 and d.reason_names() == [
        f"unknown_schema_id:{schema_id + 99}",
        "not_confluent_avro",
    ]
    plain = decode(encode_values(rows, penguins.with_format("json")), penguins)
    assert np.array_equal(d.x, plain.x)
    assert registry.latest("penguins-value") == (schema_id, avro_schema(penguins))


def test_csv_json_lines_and_parquet_files_read_alike(tmp_path: Path, penguins: TableSchema) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [r for _, block, _ in table_files.read_rows(PENGUINS) for r in block]
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
        assert np.allclose(loaded[name].x, loaded["penguins.csv"].x) and np.array_equal(
            loaded[name].y, loaded["penguins.csv"].y
        )


def test_holdout_is_fixed_disjoint_and_spread() -> None:
    data = datasets.get("csv", PENGUINS, label="species")
    train, test = data.load("train"), data.load("test")
    assert len(train.y) + len(test.y) == 344 and not set(train.ids.tolist()) & set(
        test.ids.tolist()
    )
    assert 20 <= len(test.y) <= 50 and test.ids.min() < 100 < test.ids.max()
    assert (
        held_out(np.arange(1000, dtype=np.uint64), 0.1).tolist()
        == held_out(np.arange(1000, dtype=np.uint64), 0.1).tolist()
    )
    keys = [str(i).encode() for i in range(10_000)]
    share = record_key.held_out(keys, np.arange(10_000), 0.02).mean()
    assert 0.015 < share < 0.025


def test_serving_transforms_raw_instances_as_training_did(penguins: TableSchema) -> None:
    schema = codec.table("penguins", penguins.unlabelled())
    body = {
        "instances": [
            {"island": "Dream", "bill_length_mm": "45.1", "sex": None},
            {"island": "Biscoe", "bill_length_mm": 50.5, "flipper_length_mm": 225},
        ]
    }
    x, columnar = instances.parse(json.dumps(body).encode(), schema, max_instances=8)
    assert not columnar and np.allclose(x, encode_rows(body["instances"], penguins))
    with pytest.raises(instances.BadRequest, match="instance 1: not_a_number:bill_length_mm") as e:
        instances.parse(
            b'{"instances": [{"island": "Dream"}, {"bill_length_mm": "long"}]}',
            schema,
            max_instances=8,
        )
    assert e.value.reason == "bad_field"
    with pytest.raises(instances.BadRequest, match="to be an object of the fields"):
        instances.parse(b'{"instances": [[1, 2, 3]]}', schema, max_instances=8)


def _dirty_csv(path: Path, bad_share: float = 0.4) -> Path:
    """Penguins with a share of garbage rows (every field a word) among the real ones."""
    lines = PENGUINS.read_text().splitlines()
    header, rows = lines[0], lines[1:]
    garbage = ",".join(["abc"] * len(header.split(",")))
    every = max(1, round(1 / bad_share))
    mixed = [garbage if i % every == every - 1 else row for i, row in enumerate(rows)]
    path.write_text("\n".join([header, *mixed]) + "\n")
    return path


def test_schema_infer_names_numbers_taken_as_categories_and_offers_the_numeric_reading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Proves (issue 41, item 1): garbage rows among numbers made every numeric column a
    vocabulary holding "abc", with no word; now each such column is named with examples,
    and --numeric reads it as numbers (the garbage then rejected by name)."""
    dirty = _dirty_csv(tmp_path / "dirty.csv")
    assert (
        exit_code(
            "schema", "infer", str(dirty), "--label", "species", "-o", str(tmp_path / "s.json")
        )
        == 0
    )
    err = capsys.readouterr().err
    assert (
        "note: column 'bill_length_mm' taken as categorical: " in err and "(e.g. 'abc')" in err
    ), err
    assert "add --numeric bill_length_mm" in err
    assert (
        exit_code(
            "schema",
            "infer",
            str(dirty),
            "--label",
            "species",
            "--numeric",
            "bill_length_mm",
            "--numeric",
            "body_mass_g",
            "-o",
            str(tmp_path / "n.json"),
        )
        == 0
    )
    kinds = {f.name: f.kind for f in TableSchema.load(tmp_path / "n.json").features}
    assert (
        kinds["bill_length_mm"] == kinds["body_mass_g"] == "numeric"
        and kinds["bill_depth_mm"] == "categorical"
    )
    assert "bill_length_mm" not in capsys.readouterr().err
    clean = datasets.Table(dirty, schema=tmp_path / "n.json", holdout=0.0)
    clean.load("train")
    assert clean.malformed_by_reason.get("not_a_number:bill_length_mm", 0) > 100


def test_the_same_rows_are_held_out_whatever_the_files_format(
    tmp_path: Path, penguins: TableSchema
) -> None:
    """Proves (issue 41, item 4): a CSV counted rows from line 2 and Parquet from 1, so the same
    table held out different rows by format; the 0-based row index is the same in both."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [r for _, block, _ in table_files.read_rows(PENGUINS) for r in block]
    pq.write_table(
        pa.Table.from_pylist(datasets.Table(PENGUINS, schema=penguins)._typed(rows)),
        tmp_path / "p.parquet",
    )
    csv_test = datasets.Table(PENGUINS, schema=penguins, holdout=0.1).load("test")
    parquet_test = datasets.Table(tmp_path / "p.parquet", schema=penguins, holdout=0.1).load("test")
    assert csv_test.ids.tolist() == parquet_test.ids.tolist() and len(csv_test.ids) > 20
    assert np.allclose(csv_test.x, parquet_test.x)


def test_an_empty_file_is_refused_before_anything_starts(
    tmp_path: Path, penguins: TableSchema, capsys: pytest.CaptureFixture[str]
) -> None:
    """Proves (issue 41, item 4): a header-only CSV with --schema started Kafka and Spark and
    left .lock, run.json and spark-checkpoint/ behind; now one line, exit 2, no folder."""
    (tmp_path / "s.json").write_text(penguins.to_json())
    (tmp_path / "empty.csv").write_text(PENGUINS.read_text().splitlines()[0] + "\n")
    assert (
        exit_code(
            "run",
            "--data",
            str(tmp_path / "empty.csv"),
            "--schema",
            str(tmp_path / "s.json"),
            "--out",
            str(tmp_path / "run"),
        )
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Expected rows in" in err[0] and "Received none" in err[0], err
    assert not (tmp_path / "run").exists()


def test_nested_parquet_columns_are_refused_by_name(tmp_path: Path, penguins: TableSchema) -> None:
    """Proves (issue 41, item 4): lists and structs were hashed as categories; now refused by
    name."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "n.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [
                {"x": 1.0, "tags": ["a", "b"], "where": {"lat": 1.0}, "y": "p"},
                {"x": 2.0, "tags": [], "where": {"lat": 2.0}, "y": "q"},
            ]
        ),
        path,
    )
    with pytest.raises(ConfigError, match=r"column 'tags'.*Received a list.*--ignore tags"):
        datasets.Table(path, label="y")
    schema = TableSchema.from_dict(
        {
            "features": [{"name": "x"}, {"name": "tags", "kind": "categorical", "hash_buckets": 8}],
            "label": {"name": "y", "classes": ["p", "q"]},
        }
    )
    with pytest.raises(ConfigError, match=r"nested ones: 'tags' \(list<element: string>\)"):
        datasets.Table(path, schema=schema)
    flat = TableSchema.from_dict(
        {"features": [{"name": "x"}], "label": {"name": "y", "classes": ["p", "q"]}}
    )
    assert (
        len(datasets.Table(path, schema=flat, holdout=0.0).load("train").y) == 2
    )  # the flat columns alone: fine


def test_confluent_framing_with_the_schema_from_the_file(penguins: TableSchema) -> None:
    """Proves (issue 41, item 2): framed records read by the file's writer schema, the id
    checked where the file names one; plain reading of framed records names the fix."""
    rows = [r for _, block, _ in table_files.read_rows(PENGUINS) for r in block][:20]
    plain = penguins.with_format("avro")
    framed = TableSchema.from_dict({**plain.to_dict(), "wire": "confluent", "schema_id": 7})
    values = encode_values(rows, plain, schema_id=7)
    other = encode_values(rows[:1], plain, schema_id=8)
    d = decode(values + other, framed)
    assert len(d.y) == 20 and d.reason_names() == ["unknown_schema_id:8"]
    assert np.array_equal(d.x, decode(encode_values(rows, plain), plain).x)
    assert (
        len(
            decode(values + other, TableSchema.from_dict({**framed.to_dict(), "schema_id": None})).y
        )
        == 21
    )
    assert set(decode(values, plain).reason_names()) == {
        "confluent_framed"
    }  # read as plain: the fix is named
    from pipeline.jobs.rejects import HINTS, Rejects

    tally = Rejects()
    tally.add_stream({"confluent_framed": 20}, trained=0)
    assert 'add "wire": "confluent" to the schema file' in str(tally.verdict(final=True))
    assert "confluent_framed" in HINTS


def test_avro_files_read_alike_and_schema_infer_reads_them(
    tmp_path: Path, penguins: TableSchema
) -> None:
    """Proves (issue 41, item 2): `.avro` object container files are tables like the rest, and
    `schema infer` reads one, keeping its writer's schema for --format avro."""
    import fastavro

    from pipeline.table.schema import avro_schema

    rows = datasets.Table(PENGUINS, schema=penguins)._typed(
        [r for _, block, _ in table_files.read_rows(PENGUINS) for r in block]
    )
    writer = avro_schema(penguins, name="Penguin")
    with open(tmp_path / "p.avro", "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(writer), [{k: r.get(k) for k in r} for r in rows])
    from_avro = datasets.Table(tmp_path / "p.avro", schema=penguins, holdout=0.0).load("train")
    assert np.allclose(
        from_avro.x, datasets.Table(PENGUINS, schema=penguins, holdout=0.0).load("train").x
    )
    assert (
        exit_code(
            "schema",
            "infer",
            str(tmp_path / "p.avro"),
            "--label",
            "species",
            "-o",
            str(tmp_path / "s.json"),
        )
        == 0
    )
    inferred = TableSchema.load(tmp_path / "s.json")
    assert (
        inferred.format == "avro"
        and inferred.avro is not None
        and inferred.avro["name"] == "Penguin"
    )
    assert [f.kind for f in inferred.features] == [f.kind for f in penguins.features]


def test_schema_infer_reads_a_framed_avro_topic(
    broker,
    topic: str,
    tmp_path: Path,  # type: ignore[no-untyped-def]
    penguins: TableSchema,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Proves (issue 41, item 2): `schema infer --format avro` pointed the user at itself; now
    it reads a topic of Confluent-framed records (confluent-kafka's producer) by the writer's
    .avsc, and writes the framing and the id into the schema; without a writer's schema it
    says what to pass."""
    from confluent_kafka import Producer

    from pipeline.table.schema import avro_schema

    rows = [r for _, block, _ in table_files.read_rows(PENGUINS) for r in block][
        ::3
    ]  # every species
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for value in encode_values(
        datasets.Table(PENGUINS, schema=penguins)._typed(rows),
        penguins.with_format("avro"),
        schema_id=42,
    ):
        producer.produce(topic, value=value)
    assert producer.flush(30) == 0
    del producer  # its connection closed before the session's broker stops
    (tmp_path / "w.avsc").write_text(json.dumps(avro_schema(penguins)))
    assert (
        exit_code(
            "schema",
            "infer",
            "--topic",
            topic,
            "--bootstrap",
            broker.bootstrap,
            "--format",
            "avro",
            "--label",
            "species",
        )
        == 2
    )
    assert (
        "framing (schema id 42): pass --schema-registry URL, or the writer's schema as "
        "--avro-schema" in capsys.readouterr().err
    )
    assert (
        exit_code(
            "schema",
            "infer",
            "--topic",
            topic,
            "--bootstrap",
            broker.bootstrap,
            "--format",
            "avro",
            "--avro-schema",
            str(tmp_path / "w.avsc"),
            "--label",
            "species",
            "-o",
            str(tmp_path / "s.json"),
        )
        == 0
    )
    inferred = TableSchema.load(tmp_path / "s.json")
    assert (inferred.format, inferred.wire, inferred.schema_id) == ("avro", "confluent", 42)
    assert inferred.label is not None and inferred.label.classes == penguins.label.classes  # type: ignore[union-attr]


def test_an_unreachable_registry_is_one_line_within_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Proves (issue 41, item 2): 110 s of silence and a traceback; now one line within 10 s,
    before anything starts."""
    import time

    from tests.conftest import free_port

    (tmp_path / "s.json").write_text(
        json.dumps(
            {
                "format": "avro",
                "features": [{"name": "x"}],
                "label": {"name": "y", "classes": ["a", "b"]},
            }
        )
    )
    started = time.monotonic()
    assert (
        exit_code(
            "run",
            "--bootstrap",
            "127.0.0.1:9",
            "--topic",
            "t",
            "--schema",
            str(tmp_path / "s.json"),
            "--schema-registry",
            f"http://127.0.0.1:{free_port()}",
            "--out",
            str(tmp_path / "run"),
        )
        == 2
    )
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Expected a Schema Registry at http://127.0.0.1:" in err[0], err
    assert not (tmp_path / "run").exists()


def test_schema_infer_reads_framed_avro_through_a_registry(penguins: TableSchema) -> None:
    """Proves (issue 41, item 2): framed records whose ids a registry resolves are read for a
    schema without a writer's file; plain bodies with a registry only are refused in one line."""
    from confluent_kafka.schema_registry import Schema

    from pipeline.table import avro_sample
    from pipeline.table.schema import avro_schema

    mock = client("mock://streamtrain-infer")
    schema_id = mock.register_schema("p-value", Schema(json.dumps(avro_schema(penguins)), "AVRO"))
    rows = datasets.Table(PENGUINS, schema=penguins)._typed(
        [r for _, block, _ in table_files.read_rows(PENGUINS) for r in block][:30]
    )
    plain = penguins.with_format("avro")
    got = avro_sample.read(encode_values(rows, plain, schema_id=schema_id), registry=Registry(mock))
    assert (
        got.framed
        and got.schema_id == schema_id
        and got.columns["island"][:2] == ["Torgersen", "Torgersen"]
    )
    with pytest.raises(ConfigError, match="Received plain Avro bodies"):
        avro_sample.read(encode_values(rows, plain), registry=Registry(mock))


def test_arrows_columns_and_the_careful_path_decode_alike(penguins: TableSchema) -> None:
    """Proves: a block of typed JSON objects read by Arrow's columns (the fast path) gives the
    very input and labels the record-by-record path gives (one bad record sends the block there)."""
    from pipeline.table import arrow_json

    rows = datasets.Table(PENGUINS, schema=penguins)._typed(
        [r for _, block, _ in table_files.read_rows(PENGUINS) for r in block]
    )
    values = encode_values(rows, penguins)
    assert (
        arrow_json.columns(values, penguins) is not None
    )  # typed, every record an object: Arrow reads it
    fast, careful = decode(values, penguins), decode([*values, b"{oops"], penguins)
    assert careful.reason_names() == ["not_json"] and len(fast.y) == len(careful.y) == 344
    assert np.array_equal(fast.x, careful.x) and np.array_equal(fast.y, careful.y)
    regression = infer(sample_columns(PENGUINS), label="body_mass_g")
    values = encode_values(
        datasets.Table(PENGUINS, schema=regression)._typed(
            [r for _, block, _ in table_files.read_rows(PENGUINS) for r in block]
        ),
        regression,
    )
    fast, careful = decode(values, regression), decode([*values, b"[1]"], regression)
    assert np.array_equal(fast.x, careful.x) and np.array_equal(fast.y, careful.y)
    assert fast.reason_names() == careful.reason_names()[:-1]  # the masses that are gaps, alike


def test_numbers_as_class_labels_and_ids_take_arrows_path_and_decode_alike(
    tmp_path: Path,
) -> None:
    """Proves: a click block whose label is a JSON number (``"clicked": 0``), its IDs text or
    integers, is read by Arrow (the fast path) into the very input and labels the careful path
    gives; a later record writing the label as text, or a label beyond float64's integers,
    sends the block to the careful path, which reads it exactly."""
    from pipeline.table import arrow_json
    from producers.datasets.click_stream import click_schema
    from producers.datasets.clicks import ClickModel

    model = ClickModel(users=500, items=100, dense=2, seed=3)
    schema = click_schema(model)
    lines = model.write_jsonl(tmp_path / "clicks.jsonl", 300).read_bytes().splitlines()
    records = [json.loads(line) for line in lines]
    numbered = [json.dumps({**r, "user_id": int(r["user_id"][1:])}).encode() for r in records]
    for block in (lines, numbered):
        assert arrow_json.columns(block, schema) is not None
        fast, careful = decode(block, schema), decode([*block, b"{oops"], schema)
        assert careful.reason_names() == ["not_json"] and len(fast.y) == 300
        assert np.array_equal(fast.x, careful.x) and np.array_equal(fast.y, careful.y)
        assert set(fast.y.tolist()) == {0, 1}
    texts = [*lines[:-1], json.dumps({**records[-1], "clicked": "1"}).encode()]
    huge = [*lines[:-1], json.dumps({**records[-1], "clicked": 2**53 + 1}).encode()]
    assert arrow_json.columns(texts, schema) is None and arrow_json.columns(huge, schema) is None
    got = decode(texts, schema)
    assert np.array_equal(got.x, decode(lines, schema).x) and got.y[-1] == 1
    assert decode(huge, schema).reason_names() == ["unknown_class:clicked"]
