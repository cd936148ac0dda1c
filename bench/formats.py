"""Benchmark: a user's table through the stream, as JSON and as Avro records, each against a
bare decode loop of the same records with the same library in one process, in the same run.

The table is the HIGGS sample's 28 features plus 3 categorical columns (5, 12 and 3
values, drawn with a fixed seed), its label as a class name. Each format's records go
into a topic of their own (by the replay, from a JSON lines file); the stream arm is
bench/source.py's: the real StreamJob (Python Kafka source, local[2], availableNow,
20,000-record micro-batches, a handler that only counts), so records/s include Kafka,
Spark's triggers and the schema's transform into the model's input. The bare arm parses
the very same values in a loop in this process (orjson.loads; fastavro's
schemaless_reader), transforming nothing. ``binary_rps`` is the HIGGS binary records'
stream in the same run, for scale.

What the stream carries of the user's table against the binary format: the very rows,
transformed once here into the model's input and written as binary records (the layout
the built-in datasets use, as wide as the schema's encoding) into a topic of their own;
``json_vs_binary`` and ``avro_vs_binary`` are each format's stream records/s over that
binary stream's (targets >= 0.9). ``json_decode_ratio`` and ``avro_decode_ratio``: the
decode and transform into the model's input (``pipeline.table.decode``) in this process,
over the bare parse loop of the same values (targets >= 0.5).

    .venv/bin/python bench/formats.py [--records 60000]

Last line: ``formats json_rps=<n> json_ratio=<r> avro_rps=<n> avro_ratio=<r> binary_rps=<n>
table_binary_rps=<n> json_vs_binary=<r> avro_vs_binary=<r> json_decode_ratio=<r>
avro_decode_ratio=<r>`` (targets: json_ratio and avro_ratio >= 0.8).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from source import stream_arm  # noqa: E402

from pipeline import cluster, codec  # noqa: E402
from pipeline.ingest import microbatch as stream  # noqa: E402
from pipeline.ingest.kafka import EmbeddedBroker  # noqa: E402
from pipeline.table import TableSchema, decode, infer  # noqa: E402
from pipeline.table.writers import encode_values  # noqa: E402
from producers import Replay, datasets  # noqa: E402
from producers.datasets.base import Chunk, Dataset, chunk_arrays  # noqa: E402

CATEGORIES = {
    "channel": [f"c{i}" for i in range(5)],
    "region": [f"region-{i}" for i in range(12)],
    "tier": ["gold", "silver", "bronze"],
}


class Count(stream.Handler):
    """Counts the decoded records (defined here, in ``__main__``, so executors unpickle it by
    value)."""

    def process(self, block: stream.Block) -> dict[str, int]:
        return {"n": len(block.y), "width": int(block.x.shape[1])}


def table_rows() -> list[dict[str, object]]:
    """The HIGGS sample as rows of named fields, with three categorical columns."""
    higgs = datasets.get("higgs").load("train")
    rng = np.random.default_rng(7)
    rows = []
    for x, y in zip(higgs.x.tolist(), higgs.y.tolist(), strict=True):
        row: dict[str, object] = {f"f{i}": round(v, 6) for i, v in enumerate(x)}
        row.update({name: values[rng.integers(len(values))] for name, values in CATEGORIES.items()})
        row["label"] = "signal" if y else "background"
        rows.append(row)
    return rows


class Encoded(Dataset):
    """A table's rows already transformed into the model's input, replayed as binary records."""

    def __init__(self, x: np.ndarray, y: np.ndarray, num_classes: int) -> None:
        super().__init__()
        self.name, self.x, self.y = "table-binary", x, y
        self.schema = codec.generic(x.shape[1], num_classes)

    def iter_chunks(self, split: str = "train", *, chunk_rows: int = 4096) -> Iterator[Chunk]:
        yield from chunk_arrays(self.x, self.y, chunk_rows)


def decode_rps(values: list[bytes], table: TableSchema, repeats: int = 3) -> float:
    """The best of ``repeats`` decodes of ``values`` into the model's input, in this process."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        decoded = decode(values, table)
        best = min(best, time.perf_counter() - started)
    assert len(decoded.y) == len(values), decoded.reject_counts()
    return len(values) / best


def bare_rps(values: list[bytes], fmt: str, table: TableSchema, repeats: int = 3) -> float:
    """The best of ``repeats`` plain decode loops over ``values`` in this process."""
    if fmt == "json":
        import orjson

        def one() -> None:
            for v in values:
                orjson.loads(v)
    else:
        from fastavro import parse_schema, schemaless_reader

        writer = parse_schema(table.avro)

        def one() -> None:
            for v in values:
                schemaless_reader(io.BytesIO(v), writer, None)

    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        one()
        best = min(best, time.perf_counter() - started)
    return len(values) / best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=60_000)
    ap.add_argument("--per-batch", type=int, default=20_000)
    args = ap.parse_args()
    rows = table_rows()
    table = infer({k: [r[k] for r in rows] for k in rows[0]}, label="label")
    n = args.records
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker() as broker:
        file = Path(tmp) / "higgs-table.jsonl"
        file.write_text("".join(json.dumps(r) + "\n" for r in rows))
        schemas = {}
        for fmt in ("json", "avro"):
            data = datasets.Table(
                file, schema=table.with_format(fmt), holdout=0.0, name=f"higgs-{fmt}"
            )
            Replay(
                data,
                bootstrap=broker.bootstrap,
                topic=f"table-{fmt}",
                partitions=2,
                loop=True,
                limit=n,
            ).run()
            schemas[fmt] = data.schema
        Replay(
            datasets.get("higgs"),
            bootstrap=broker.bootstrap,
            topic="binary",
            partitions=2,
            loop=True,
            limit=n,
        ).run()
        # The same rows in the binary format: transformed here once, by the same schema.
        whole = datasets.Table(file, schema=table, holdout=0.0).load("train")
        encoded = Encoded(whole.x, whole.y, table.num_classes)
        Replay(
            encoded,
            bootstrap=broker.bootstrap,
            topic="table-binary",
            partitions=2,
            loop=True,
            limit=n,
        ).run()
        spark = cluster.session("local[2]", app="bench-formats")
        try:
            stream_arm(
                spark, broker.bootstrap, "binary", codec.HIGGS, n, args.per_batch, Count()
            )  # warm-up
            binary, _ = stream_arm(
                spark, broker.bootstrap, "binary", codec.HIGGS, n, args.per_batch, Count()
            )
            print(f"binary: stream {binary:,.0f} records/s", flush=True)
            table_binary, _ = stream_arm(
                spark, broker.bootstrap, "table-binary", encoded.schema, n, args.per_batch, Count()
            )
            print(
                f"the table as binary records ({encoded.schema.n_features} columns): stream "
                f"{table_binary:,.0f} records/s",
                flush=True,
            )
            results = {}
            for fmt, schema in schemas.items():
                rps, _ = stream_arm(
                    spark, broker.bootstrap, f"table-{fmt}", schema, n, args.per_batch, Count()
                )
                values = encode_values(rows, schema.table)
                values = (values * (n // len(values) + 1))[:n]
                bare = bare_rps(values, fmt, schema.table)
                decoded = decode_rps(values, schema.table)
                results[fmt] = (rps, bare, decoded)
                print(
                    f"{fmt}: stream {rps:,.0f} records/s decoded and transformed on executors; "
                    f"bare decode loop {bare:,.0f} records/s; ratio {rps / bare:.2f}; "
                    f"{rps / table_binary:.2f} of the binary stream; decode and transform here "
                    f"{decoded:,.0f} records/s, {decoded / bare:.2f} of the bare loop",
                    flush=True,
                )
        finally:
            cluster.stop(spark)
    (json_rps, json_bare, json_dec), (avro_rps, avro_bare, avro_dec) = (
        results["json"],
        results["avro"],
    )
    print(
        f"formats json_rps={json_rps:.0f} json_ratio={json_rps / json_bare:.2f} "
        f"avro_rps={avro_rps:.0f} avro_ratio={avro_rps / avro_bare:.2f} binary_rps={binary:.0f} "
        f"table_binary_rps={table_binary:.0f} json_vs_binary={json_rps / table_binary:.2f} "
        f"avro_vs_binary={avro_rps / table_binary:.2f} "
        f"json_decode_ratio={json_dec / json_bare:.2f} "
        f"avro_decode_ratio={avro_dec / avro_bare:.2f}"
    )


if __name__ == "__main__":
    main()
