"""ID features benchmark: a click stream with a known best, learned online through the row
servers, against the same model offline, a hashing trick of the same memory, and River's
factorization machine on the same records.

The stream is streamtrain's click model (:mod:`producers.datasets.clicks`): users and items
drawn from Zipf laws (exponent 1) over a million and 200,000 popularity slots whose IDs keep
renewing, each with a hidden vector; a click's probability is the logistic of their dot
product, biases and three dense features. Its settings are printed first. Arms:

- ``online``: ``streamtrain run --data clicks.jsonl`` with the user and the item as ID
  features (``dim`` 16, ``ttl`` records), the default model; its prequential AUC over the last
  tenth of the stream (each record scored before it trains, from the batches' histograms).
- ``dense``: the same network (its hidden layers as wide) on the dense features alone (the ID
  columns dropped), on the first ``--dense-records``: the throughput baseline.
- ``offline``: the same network (the rows as Keras embeddings of every ID in the first nine
  tenths, an unknown ID a shared row) trained three epochs on the first nine tenths, scored
  on the last tenth.
- ``hashing``: the same network with the IDs hashed into as many buckets as the row tables'
  memory holds, trained prequentially in one pass (each mini-batch scored, then trained).
- ``river_fm``: River's ``FMClassifier`` (16 factors, one-hot IDs), prequential.

Figures: ``auc`` (online), ``auc_bayes`` (the generator's true probabilities), ``auc_share`` =
(auc - 0.5) / (auc_bayes - 0.5); ``vs_offline`` = (auc - 0.5) / (offline's - 0.5);
``vs_river_fm``, ``vs_hashing``: auc over theirs; ``bytes_per_row``: the tables' bytes per row
over a row's float32 values and Adagrad state; ``mem_growth``: the tables' bytes at the end
over those at half way, minus 1; ``throughput_ratio``: the online run's records/s over the
dense run's.

    .venv/bin/python bench/embeddings.py [--records 2000000] [--only online,offline,...]

At full size it runs 15-30 minutes on 2 cores: run it alone. ``--records 200000`` checks it
end to end in a few minutes (the figures then mean little).

Last line: ``embeddings auc=… auc_bayes=… auc_share=… vs_offline=… vs_river_fm=… vs_hashing=…
bytes_per_row=… mem_growth=… throughput_ratio=…``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline.train.evaluation import roc_auc  # noqa: E402
from pipeline.train.partition import hist_auc  # noqa: E402
from producers.datasets.click_stream import click_schema  # noqa: E402
from producers.datasets.clicks import ClickModel  # noqa: E402

DIM = 16
BATCH = 512
ARMS = ("online", "dense", "offline", "hashing", "river_fm")


def _say(line: str) -> None:
    print(line, flush=True)


DENSE_MODEL = """
def build():
    import keras

    hidden = min(256, max(32, 4 * {width}))  # the ID model's widths (pipeline.train.zoo)
    return keras.Sequential([
        keras.Input(({dense},)),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(max(16, hidden // 2), activation="relu"),
        keras.layers.Dense(2, activation="softmax"),
    ])
"""


def _run(
    folder: Path, data: Path, schema: Path, name: str, out: Path, *extra: str
) -> dict[str, Any]:
    """One ``streamtrain run`` of the file, alone; its report and batches."""
    cmd = [
        str(ROOT / ".venv/bin/streamtrain"),
        "run",
        "--data",
        str(data),
        "--schema",
        str(schema),
        "--holdout",
        "0.01",
        "--max-offsets-per-trigger",
        "20000",
        "--seed",
        "1",
        # One batch size for both arms (a table on the default model would take 16, a size
        # for tables of hundreds of rows, not a click stream of millions).
        "--batch-size",
        str(BATCH),
        "--out",
        str(out),
        *extra,
    ]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{name}: the run failed:\n{done.stderr[-3000:]}")
    report = json.loads((out / "report.json").read_text())
    batches = [json.loads(line) for line in (out / "batches.jsonl").read_text().splitlines()]
    # Records over the batches' own seconds: start-up, triggers and scoring left out alike.
    rate = sum(b["trained"] for b in batches) / max(1e-9, sum(b["batch_s"] for b in batches))
    _say(
        f"{name}: {report['trained_records']:,} records in {time.monotonic() - started:.0f} s, "
        f"{rate:,.0f}/s in its {len(batches)} batches"
    )
    return {"report": report, "batches": batches, "rate": rate}


def _online_figures(run: dict[str, Any]) -> dict[str, float]:
    batches = run["batches"]
    total = sum(b["trained"] for b in batches)
    seen, pos, neg = 0, None, None
    for b in batches:
        seen += b["trained"]
        hist = b.get("prequential_hist")
        if hist is None or seen <= 0.9 * total:  # batches ending in the last tenth
            continue
        p, n = np.asarray(hist[1]), np.asarray(hist[0])
        pos = p if pos is None else pos + p
        neg = n if neg is None else neg + n
    sizes = [b["tables"]["sizes"] for b in batches if b.get("tables")]
    memory = [sum(t["bytes"] for t in s.values()) for s in sizes]
    rows = sum(t["rows"] for t in sizes[-1].values())
    return {
        "auc": (hist_auc([neg, pos]) or float("nan")) if pos is not None else float("nan"),
        "rate": run["rate"],
        "bytes": memory[-1],
        "bytes_per_row": memory[-1] / max(1, rows) / (8 * DIM),
        "mem_growth": memory[-1] / memory[len(memory) // 2] - 1.0,
    }


def _model(dense: int, vocab: tuple[int, int]) -> Any:
    """The online run's default network, its rows as Keras embeddings (index 0: unknown)."""
    import keras

    from pipeline.train import zoo

    x = keras.Input((dense,))
    u = keras.Input((), dtype="int32")
    i = keras.Input((), dtype="int32")
    eu = keras.layers.Embedding(vocab[0], DIM)(u)
    ei = keras.layers.Embedding(vocab[1], DIM)(i)
    head = zoo.table_ids(dense, 2, [DIM, DIM])
    out = head(keras.layers.Concatenate()([x, eu, ei]))
    model = keras.Model([x, u, i], out)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def _offline(model: ClickModel, records: int) -> float:
    cut = records * 9 // 10
    train, test = model.sample(0, cut), model.sample(cut, records - cut)
    users = {u: k + 1 for k, u in enumerate(np.unique(train.user_id).tolist())}
    items = {v: k + 1 for k, v in enumerate(np.unique(train.item_id).tolist())}

    def index(c: Any) -> list[np.ndarray]:
        return [
            c.x,
            np.array([users.get(u, 0) for u in c.user_id.tolist()], np.int32),
            np.array([items.get(v, 0) for v in c.item_id.tolist()], np.int32),
        ]

    net = _model(train.x.shape[1], (len(users) + 1, len(items) + 1))
    net.fit(index(train), train.label.astype(np.int32), epochs=3, batch_size=256, verbose=0)
    return roc_auc(test.label, net.predict(index(test), batch_size=8192, verbose=0)[:, 1])


def _hashing(model: ClickModel, records: int, buckets: int, batch: int = 256) -> float:
    net = _model(model.dense, (buckets, buckets))
    scores, labels = [], []
    cut = records * 9 // 10
    for start in range(0, records, 100_000):
        c = model.sample(start, min(100_000, records - start))
        u = (c.user_id * 2654435761 % buckets).astype(np.int32)
        v = (c.item_id * 2246822519 % buckets).astype(np.int32)
        y = c.label.astype(np.int32)
        for s in range(0, len(y), batch):
            part = [c.x[s : s + batch], u[s : s + batch], v[s : s + batch]]
            if start + s >= cut:
                scores.append(net.predict_on_batch(part)[:, 1])
                labels.append(y[s : s + batch])
            net.train_on_batch(part, y[s : s + batch])
    return roc_auc(np.concatenate(labels), np.concatenate(scores))


def _river_fm(model: ClickModel, records: int) -> float:
    from river import facto

    fm = facto.FMClassifier(n_factors=DIM, seed=1)
    scores, labels = [], []
    cut = records * 9 // 10
    for start in range(0, records, 100_000):
        c = model.sample(start, min(100_000, records - start))
        for k in range(len(c)):
            row = {f"u{c.user_id[k]}": 1.0, f"i{c.item_id[k]}": 1.0}
            row.update({f"x{j}": float(c.x[k, j]) for j in range(model.dense)})
            if start + k >= cut:
                scores.append(fm.predict_proba_one(row).get(True, 0.0))
                labels.append(int(c.label[k]))
            fm.learn_one(row, bool(c.label[k]))
    return roc_auc(np.array(labels), np.array(scores))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--dense-records", type=int, default=500_000)
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--ttl", type=int, default=500_000)
    parser.add_argument("--only", default=",".join(ARMS))
    args = parser.parse_args()
    only = set(args.only.split(","))
    model = ClickModel(users=args.users, items=args.items, exponent=1.0, seed=11)
    _say(f"generator: {json.dumps(model.settings())}")
    n = args.records
    tenth = n // 10
    ids = model.sample(0, n)
    distinct = len(np.unique(ids.user_id)) + len(np.unique(ids.item_id))
    bayes = model.best(n - tenth, tenth, auc=roc_auc)
    _say(f"stream: {n:,} records, {distinct:,} distinct IDs seen; best {json.dumps(bayes)}")
    got: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="st-embeddings-") as tmp:
        folder = Path(tmp)
        if only & {"online", "dense"}:
            data = model.write_jsonl(folder / "clicks.jsonl", n)
            ids_schema = folder / "ids.schema.json"
            ids_schema.write_text(click_schema(model, dim=DIM, ttl=args.ttl).to_json())
        if "online" in only:
            got.update(_online_figures(_run(folder, data, ids_schema, "online", folder / "o")))
        if "dense" in only:
            table = json.loads(ids_schema.read_text())
            table["features"] = [f for f in table["features"] if f["kind"] != "id"]
            dense_schema = folder / "dense.schema.json"
            dense_schema.write_text(json.dumps(table))
            head = folder / "head.jsonl"
            with open(data, "rb") as src, open(head, "wb") as dst:
                for _, line in zip(range(args.dense_records), src, strict=False):
                    dst.write(line)
            (folder / "dense_model.py").write_text(
                DENSE_MODEL.format(dense=model.dense, width=model.dense + 2 * DIM)
            )
            model_arg = f"{folder / 'dense_model.py'}:build"
            dense = _run(folder, head, dense_schema, "dense", folder / "d", "--model", model_arg)
            got["dense_rate"] = dense["rate"]
    if "offline" in only:
        got["offline"] = _offline(model, n)
        _say(f"offline: AUC {got['offline']:.4f} on the last tenth after 3 epochs")
    if "hashing" in only:
        buckets = int(got.get("bytes", 8 * 2**20) / (3 * 4 * DIM) / 2)  # two tables' worth
        got["hashing"] = _hashing(model, n, max(1024, buckets))
        _say(f"hashing: AUC {got['hashing']:.4f} over the last tenth ({buckets:,} buckets)")
    if "river_fm" in only:
        got["river_fm"] = _river_fm(model, n)
        _say(f"river_fm: AUC {got['river_fm']:.4f} over the last tenth")
    nan = float("nan")
    auc = got.get("auc", nan)
    _say(
        f"embeddings auc={auc:.4f} auc_bayes={bayes['auc']:.4f} "
        f"auc_share={(auc - 0.5) / (bayes['auc'] - 0.5):.3f} "
        f"vs_offline={(auc - 0.5) / (got.get('offline', nan) - 0.5):.3f} "
        f"vs_river_fm={auc / got.get('river_fm', nan):.3f} "
        f"vs_hashing={auc / got.get('hashing', nan):.3f} "
        f"bytes_per_row={got.get('bytes_per_row', nan):.2f} "
        f"mem_growth={got.get('mem_growth', nan):.3f} "
        f"throughput_ratio={got.get('rate', nan) / got.get('dense_rate', nan):.3f}"
    )


if __name__ == "__main__":
    main()
