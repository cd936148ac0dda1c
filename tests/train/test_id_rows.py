"""Partition training of a model with ID features through the row servers, under an
asynchronous algorithm (the default, synchronous SGD, runs in tests/jobs/test_id_features.py):
the rows learn from the input's gradient, a retried task's steps are applied once."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.table.id_settings import ROW_LEARNING_RATE
from pipeline.table.ids import IdLayout
from pipeline.train import algorithms, zoo
from pipeline.train.id_rows import IdRows
from pipeline.train.model import ModelSpec, get_flat
from pipeline.train.partition import ServerInfo, TaskResult, train_partition
from pipeline.train.ps.protocol import task_key
from pipeline.train.ps.row_client import RowClient
from pipeline.train.ps.rows import RowSpec
from pipeline.train.row_servers import RowServers, specs_of
from pipeline.train.server import parameter_server
from producers.datasets.click_stream import ClickStream, click_schema
from producers.datasets.clicks import ClickModel


@pytest.mark.slow  # TensorFlow and a model traced: seconds, not milliseconds
@pytest.mark.parametrize("name", ["adag", "downpour"])
def test_an_asynchronous_algorithm_trains_the_rows_of_its_batches_once(name: str) -> None:
    model = ClickModel(users=300, items=100, seed=2)
    schema = click_schema(model, dim=4, ttl=None)
    # The stream's blocks hold the IDs' keys, whatever the rows' size the schema gives them.
    chunk = next(ClickStream(model=model).iter_chunks(chunk_rows=3_000))
    algo = algorithms.get({"name": name, "config": {"num_workers": 1, "batch_size": 64}})
    net = zoo.for_dataset(f"table_ids:{model.dense}:2:4,4")
    spec = ModelSpec.from_model(net, optimizer=algo.worker_optimizer, loss=algo.loss)
    server = parameter_server(algo, spec, get_flat(net), host="127.0.0.1")
    rows = RowServers(specs_of(schema, 1), secret=server.secret, host="127.0.0.1")
    layout = IdLayout(schema)
    x = chunk.x
    with server, rows:
        info = ServerInfo.of(server, "float32", rows)
        before = {t: rows.table_rows(t)["values"].copy() for t in range(2)}
        kwargs = dict(
            spec=spec,
            algorithm=algorithms.serialize(algo),
            server=info,
            worker=0,
            job="j",
            seed=(1, 0, 0),
            task=task_key("clicks", 0, 0),
            layout=layout,
        )
        first = train_partition(x, chunk.y, **kwargs)  # type: ignore[arg-type]
        made = {t: rows.table_rows(t) for t in range(2)}
        again = train_partition(x, chunk.y, **kwargs)  # type: ignore[arg-type]  # a retry
        after = {t: rows.table_rows(t) for t in range(2)}
    assert first.rows_read > 0 and first.rows_pushed > 0 and first.preq_hist is not None
    assert again.steps_skipped == again.steps_total  # every exchange applied already
    for t in range(2):
        assert len(made[t]["keys"]) > 50  # rows created for the IDs seen
        # The shared row (the last key) learned from the IDs first seen without a row.
        assert not np.array_equal(made[t]["values"][-1:], before[t][-1:])
        for field in made[t]:  # the retry changed no row
            assert np.array_equal(made[t][field], after[t][field]), field


@pytest.mark.slow  # TensorFlow and a model traced, three times
def test_a_retry_pushes_the_rows_an_attempt_lost_in_flight_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A step's rows go out before its exchange of the dense weights and their reply is taken
    # after it: an attempt that dies with them in flight leaves the parameter server one step
    # ahead of the row servers. Its retry goes back to that step: the rows are pushed, the
    # dense exchange is dropped as a repeat, and the tables hold what an unbroken run's do.
    model = ClickModel(users=300, items=100, seed=2)
    schema = click_schema(model, dim=4, ttl=None)
    chunk = next(ClickStream(model=model).iter_chunks(chunk_rows=1_000))
    algo = algorithms.get({"name": "sync", "config": {"num_workers": 1, "batch_size": 64}})
    net = zoo.for_dataset(f"table_ids:{model.dense}:2:4,4")
    spec = ModelSpec.from_model(net, optimizer=algo.worker_optimizer, loss=algo.loss)
    task, lost = task_key("clicks", 0, 0), 5
    send = RowClient.send

    def lose_step(self: RowClient, reads: object, push: object = None, **kw: int) -> None:
        if kw.get("exchange") == lost and kw.get("task") == task:  # never reaches the servers
            self._sent = "lost"
            return
        send(self, reads, push, **kw)  # type: ignore[arg-type]

    receive = RowClient.receive

    def lost_reply(self: RowClient) -> object:
        if self._sent == "lost":
            raise ConnectionError("the connection broke with the rows in flight")
        return receive(self)

    def run(attempts: int) -> tuple[list[TaskResult], dict[int, set[int]], int]:
        server = parameter_server(algo, spec, get_flat(net), host="127.0.0.1")
        rows = RowServers(specs_of(schema, 1), secret=server.secret, host="127.0.0.1")
        results = []
        with server, rows:
            kwargs = dict(
                spec=spec,
                algorithm=algorithms.serialize(algo),
                server=ServerInfo.of(server, "float32", rows),
                worker=0,
                job="j",
                seed=(1, 0, 0),
                task=task,
                layout=IdLayout(schema),
            )
            for attempt in range(attempts):
                try:
                    results.append(train_partition(chunk.x, chunk.y, **kwargs))  # type: ignore[arg-type]
                except ConnectionError:
                    assert attempt == 0
                    monkeypatch.undo()
            keys = {t: set(rows.table_rows(t)["keys"].tolist()) for t in range(2)}
            with RowClient(rows.addresses, secret=server.secret, worker=9, dims=rows.dims) as c:
                applied = c.applied(task)
        return results, keys, applied

    unbroken, unbroken_keys, _ = run(1)
    monkeypatch.setattr(RowClient, "send", lose_step)
    monkeypatch.setattr(RowClient, "receive", lost_reply)
    (retry,), keys, applied = run(2)
    assert retry.steps_skipped == lost - 1
    assert retry.repeats == 1  # the dense exchange of step 5
    assert applied == unbroken[0].steps_total  # every step's rows, once
    assert keys == unbroken_keys  # each ID's sightings counted once: the same rows made


@pytest.mark.parametrize("n", [2, 64])
def test_a_rows_step_is_its_own_records_gradient_whatever_the_mini_batch_size(n: int) -> None:
    # The step's loss is the mini-batch's mean, so the input's gradient holds each record's
    # own gradient over n; a row learns from the sum over its records, n times that.
    model = ClickModel(users=300, items=100, seed=2)
    schema = click_schema(model, dim=4, ttl=None)
    layout = IdLayout(schema)
    x = next(ClickStream(model=model).iter_chunks(chunk_rows=n)).x[:n]
    own = 0.3  # every record's own gradient on each of its rows' values
    with (
        RowServers(specs_of(schema, 1), secret=b"k", host="127.0.0.1") as rows,
        RowClient(rows.addresses, secret=b"k", worker=1, dims=rows.dims) as client,
    ):
        ids = IdRows(layout, client)
        zero = np.zeros((n, layout.width), np.float32)
        ids.before(x)
        ids.after(0, zero, None)  # the IDs' first sighting makes their rows
        ids.arrive()
        start = {t: rows.table_rows(t) for t in range(2)}
        ids.before(x)
        ids.after(1, np.full_like(zero, own / n), None)
        ids.arrive()
        end = {t: rows.table_rows(t) for t in range(2)}
    specs = specs_of(schema, 1)
    assert specs[0].learning_rate == RowSpec("t", dim=1).learning_rate == ROW_LEARNING_RATE
    for c, column in enumerate(layout.columns):
        t = [s.name for s in specs].index(column.table)
        spec = specs[t]
        keys, counts = np.unique(layout.keys(x)[c], return_counts=True)
        at = np.searchsorted(start[t]["keys"], keys)
        assert np.array_equal(start[t]["keys"][at], keys)  # every ID has its row
        summed = (counts * np.float32(own))[:, None]
        # Adagrad's step on the sum: the same for a key seen once in 2 records or in 64.
        step = spec.learning_rate * summed / np.sqrt(spec.initial_accumulator + summed**2)
        moved = start[t]["values"][at] - end[t]["values"][at]
        assert np.allclose(moved, step, rtol=1e-4, atol=1e-6), column.name
