"""Where a model server runs: in the foreground (``streamtrain serve RUN_DIR``), or in a
child of a training run (``streamtrain run --serve-port P``) that reads the live center.

The child (:class:`~pipeline.cluster.processes.ChildProcess`) is spawned, not forked (the
driver holds Spark's JVM gateway and threads), and gets the parameter server's address
and secret through the spawn pipe, never in its command line or environment.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.cluster import processes
from pipeline.cluster.security import LOOPBACK
from pipeline.errors import ConfigError, StreamtrainError

if TYPE_CHECKING:
    from pipeline.config import Settings

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Listening:
    """A model server child's answer once it listens."""

    port: int
    url: str


def host_and_token(settings: Settings) -> tuple[str, str | None]:
    """Where model servers listen and the token they ask for (``STREAMTRAIN_SERVE_HOST``,
    ``STREAMTRAIN_SERVE_TOKEN`` or ``_FILE``, from the caller's ``settings``); off loopback a token
    is required."""
    token = settings.serve_token.get_secret_value() if settings.serve_token else None
    if token is None and settings.serve_token_file is not None:
        try:
            token = settings.serve_token_file.read_text().strip() or None
        except OSError as e:
            raise ConfigError(
                f"Expected STREAMTRAIN_SERVE_TOKEN_FILE to be a readable file holding the token. "
                f"Received: {settings.serve_token_file} ({e.strerror})."
            ) from None
        if token is None:
            raise ConfigError(
                f"Expected a token in STREAMTRAIN_SERVE_TOKEN_FILE={settings.serve_token_file}. "
                "Received: an empty file. Write one with: streamtrain secrets --serve-token FILE"
            )
    if settings.serve_host not in LOOPBACK and not token:
        raise ConfigError(
            f"STREAMTRAIN_SERVE_HOST={settings.serve_host} exposes the model beyond this machine: "
            "set STREAMTRAIN_SERVE_TOKEN too, or serve on 127.0.0.1."
        )
    return settings.serve_host, token


def allowed_hosts(settings: Settings) -> tuple[str, ...]:
    """``STREAMTRAIN_SERVE_ALLOWED_HOSTS`` as names (the loopback ones are always allowed)."""
    return tuple(h.strip() for h in settings.serve_allowed_hosts.split(",") if h.strip())


def check_serving(port: int, max_age_s: float | None, *, host: str) -> None:
    """Refuse a serving port or bound that cannot work on ``host``, before anything starts."""
    import socket

    if not 0 <= port <= 65535:
        raise ConfigError(f"Expected --serve-port in [0, 65535] (0: a free port). Received: {port}")
    if max_age_s is not None and max_age_s <= 0:
        raise ConfigError(f"Expected --serve-max-age > 0 seconds. Received: {max_age_s}")
    if port:
        with socket.socket() as s:
            # As the server itself binds (http.server's allow_reuse_address): a port whose last
            # connections sit in TIME_WAIT after a stop is free to it, and must be to the check.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
            except OSError as e:
                raise ConfigError(
                    f"Cannot serve predictions on {host}:{port} ({e.strerror}). "
                    "Pass another --serve-port, or 0 for a free one."
                ) from None


def serve_folder(
    run_dir: Path,
    *,
    host: str,
    port: int,
    name: str | None,
    token: str | None,
    max_age_s: float | None,
    hosts: tuple[str, ...] = (),
) -> None:
    """Serve the model of the run in ``run_dir`` from its checkpoint (reloaded whenever the
    run writes one) until SIGINT or SIGTERM."""
    from pipeline.serve.http import ModelServer
    from pipeline.serve.predictor import Predictor, read_description
    from pipeline.serve.weights import CheckpointWeights

    recorded, spec, schema = read_description(run_dir)
    source = CheckpointWeights(run_dir)
    source.start()
    rows = None
    try:
        predictor = Predictor(spec, schema, source, max_age_s=max_age_s)
        if predictor.has_ids:
            rows, predictor.rows = _checkpoint_rows(run_dir, schema)
        server = ModelServer(
            predictor, name=name or recorded, host=host, port=port, token=token, allowed_hosts=hosts
        ).start()
        print(
            f"serving {name or recorded} from {run_dir} at {server.url}:predict; Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
        with processes.stop_on_signals(threading.Event(), again_exits=False) as stop:
            processes.wait(stop)
        server.stop()
    finally:
        source.close()
        if rows is not None:
            predictor.rows.close()
            rows.stop()


def _checkpoint_rows(run_dir: Path, schema: Any) -> tuple[Any, Any]:
    """The ID tables as the run's checkpoint holds them, on row servers of this process's
    own (loopback, a fresh secret), and a connection to them."""
    from pipeline.train import checkpoint, table_store
    from pipeline.train.ps.row_client import RowClient
    from pipeline.train.row_servers import RowServers, specs_of

    state = checkpoint.load(run_dir)
    secret = os.urandom(32)
    rows = RowServers(specs_of(schema.table, 0), secret=secret, host="127.0.0.1")
    table_store.restore(run_dir, rows, state.extra.get("tables") if state else None)
    rows.start()
    return rows, RowClient(rows.addresses, secret=secret, worker=0xFFFF, dims=rows.dims)


def serve_live(job: dict[str, Any], answer: Any, stop: threading.Event) -> None:
    """The child's work: serve the live center of a run's parameter server until ``stop``.

    Args:
        job: ``spec`` (JSON), ``schema`` and ``name`` (see :func:`predictor.description`),
            ``address``, ``secret``, ``size``, ``host``, ``port``, ``token``, ``max_age_s``
            and ``refresh_s``. A restarted run's has ``run_dir`` instead of the model and
            the server: the child serves that run's checkpoint (its recorded model) until
            the parent sends the server's ``address``, ``secret``, ``size`` and ``shards``
            (:meth:`ServingProcess.follow`).
        answer: sends :class:`Listening` once the server listens.
        stop: set by the run's SIGTERM.
    """
    from pipeline.serve.http import ModelServer
    from pipeline.serve.predictor import Predictor, read_description, schema_from_dict
    from pipeline.serve.weights import RunWeights
    from pipeline.train.model import ModelSpec

    source: Any
    if "run_dir" in job:
        _, spec, schema = read_description(Path(job["run_dir"]))
        source = RunWeights(job["run_dir"], interval_s=job["refresh_s"])
    else:
        spec, schema = ModelSpec.from_json(job["spec"]), schema_from_dict(job["schema"])
        source = _live(job, job["refresh_s"], job.get("data_dir"))
    try:
        source.start()
        # One TensorFlow thread: the cores belong to the training it runs beside.
        predictor = Predictor(spec, schema, source, max_age_s=job["max_age_s"], threads=1)
        predictor.rows = _row_client(job)
        server = ModelServer(
            predictor,
            name=job["name"],
            host=job["host"],
            port=job["port"],
            token=job["token"],
            allowed_hosts=tuple(job.get("hosts", ())),
        ).start()
    except Exception:  # the child's entry point answers the error
        source.close()
        raise
    log.info("serving %s at %s:predict", job["name"], server.url)
    answer(Listening(server.port, server.url))
    try:
        if isinstance(source, RunWeights):
            _follow_when_told(source, stop, job["refresh_s"], job["run_dir"], predictor)
        processes.wait(stop)
    finally:
        server.stop()
        source.close()


def _live(job: dict[str, Any], refresh_s: float, run_dir: str | None) -> Any:
    """The live center of the parameter server ``job`` names; ``run_dir``: the run folder
    whose checkpoint says how fresh its data is."""
    from pipeline.serve.weights import LiveWeights

    return LiveWeights(
        job["address"],
        secret=job["secret"],
        size=job["size"],
        interval_s=refresh_s,
        shards=[tuple(s) for s in job.get("shards", ())],
        run_dir=run_dir,
    )


def _follow_when_told(
    source: Any, stop: threading.Event, refresh_s: float, run_dir: str, predictor: Any = None
) -> None:
    """Serve the checkpoint until the parent sends its parameter server (or ``stop``)."""
    while not stop.is_set():
        try:
            server = processes.from_parent(0.2)
        except EOFError:  # the parent is gone; its death ends this child
            return
        if server is not None:
            log.info("following the parameter server at %s", server["address"])
            source.follow(_live(server, refresh_s, run_dir))
            if predictor is not None:
                predictor.rows = _row_client(server)
            return


def _server_job(server: Any, size: int, rows: Any = None) -> dict[str, Any]:
    """How a model server reaches a run's parameter ``server`` and its ID tables' ``rows``
    (sent through the spawn pipe, never a command line or the environment: it holds the
    secret)."""
    return {
        "address": f"{server.host}:{server.port}",
        "secret": server.secret,
        "size": size,
        "shards": list(getattr(server, "shards", ())),
        **(
            {"rows": [list(a) for a in rows.addresses], "row_dims": rows.dims}
            if rows is not None
            else {}
        ),
    }


def _row_client(job: dict[str, Any]) -> Any:
    """A connection to the run's row servers, where the model has ID features (else None)."""
    if not job.get("rows"):
        return None
    from pipeline.train.ps.row_client import RowClient

    return RowClient(
        [tuple(a) for a in job["rows"]],
        secret=job["secret"],
        worker=0xFFFF,  # no worker: a reader
        dims=job["row_dims"],
    )


class ServingProcess:
    """A model server for a training run, in a spawned child that reads the live center.

    Args:
        job: what :func:`serve_live` takes.
        log_path: the child's output.
    """

    @classmethod
    def for_run(
        cls,
        *,
        name: str,
        spec: Any,
        schema: Any,
        server: Any,
        host: str,
        port: int,
        token: str | None,
        max_age_s: float,
        log_path: Path,
        hosts: tuple[str, ...] = (),
        run_dir: Path | None = None,
        rows: Any = None,
    ) -> ServingProcess:
        """The server for a run's parameter ``server`` (its address and secret) and model,
        listening on ``host:port`` (see :func:`host_and_token`); ``run_dir``: the run's
        folder, whose checkpoint says how fresh the served data is."""
        from pipeline.serve.predictor import schema_dict

        return cls(
            {
                "name": name,
                "spec": spec.to_json(),
                "schema": schema_dict(schema),
                **_server_job(server, spec.size, rows),
                "host": host,
                "port": port,
                "token": token,
                "max_age_s": max_age_s,
                "hosts": list(hosts),
                "refresh_s": min(0.2, max_age_s / 4),
                "data_dir": str(run_dir) if run_dir else None,
            },
            log_path,
        )

    @classmethod
    def for_restart(
        cls,
        *,
        run_dir: Path,
        name: str,
        host: str,
        port: int,
        token: str | None,
        max_age_s: float,
        log_path: Path,
        hosts: tuple[str, ...] = (),
    ) -> ServingProcess:
        """The server for a run restarted from ``run_dir``: it answers from the checkpoint
        (the model the folder records) before Spark and the workers are up, and follows the
        parameter server once :meth:`follow` hands it over."""
        return cls(
            {
                "run_dir": str(run_dir),
                "name": name,
                "host": host,
                "port": port,
                "token": token,
                "max_age_s": max_age_s,
                "hosts": list(hosts),
                "refresh_s": min(0.2, max_age_s / 4),
            },
            log_path,
        )

    def follow(self, server: Any, size: int, rows: Any = None) -> ServingProcess:
        """A restarted run's parameter ``server`` (of ``size`` weights) and ID tables' ``rows``
        are up: serve their live center."""
        self._child.send(_server_job(server, size, rows))
        return self

    def __init__(self, job: dict[str, Any], log_path: Path) -> None:
        self.job, self.log_path = job, log_path
        self.url: str | None = None
        self._child = processes.ChildProcess(
            serve_live, job, name="streamtrain-serve", what="the model server", log_path=log_path
        )

    def start(self) -> ServingProcess:
        """Start the child; it imports TensorFlow and builds the model while the caller goes
        on (see :meth:`wait`)."""
        self._child.start()
        return self

    def wait(self, timeout_s: float = 180.0) -> str:
        """Block until the child listens; return its URL. Raises if it failed."""
        if self.url is not None:
            return self.url
        if not self._child.ready(timeout_s):
            raise StreamtrainError(
                f"The model server did not start within {timeout_s:.0f} s; see {self.log_path}."
            )
        try:
            answer = self._child.receive()
        except EOFError:
            raise StreamtrainError(
                f"The model server died while starting; see {self.log_path}."
            ) from None
        if isinstance(answer, processes.ChildFailed):
            raise StreamtrainError(f"The model server failed to start: {answer.error}")
        self.url = answer.url
        return self.url

    def stop(self) -> None:
        self._child.stop()
