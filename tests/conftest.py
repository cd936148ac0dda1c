"""Real services for the tests: one embedded Kafka broker per session, a fresh topic per test."""

from __future__ import annotations

import os
import re
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline import config
from pipeline.ingest.kafka import EmbeddedBroker, client

ROOT = Path(__file__).resolve().parent.parent
#: The real HIGGS sample shipped with the package. Every test (and every run a test starts)
#: reads it, whatever the user's data folder holds: a full HIGGS.csv.gz there would make
#: the tests read 11M rows.
SAMPLES = ROOT / "producers" / "datasets" / "samples"
os.environ["STREAMTRAIN_DATA_DIR"] = str(SAMPLES)


@pytest.fixture(scope="session", autouse=True)
def _kafka_for_every_process(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Apache Kafka's jars, resolved once into the user's cache, for every process the tests
    start: many start with a cache folder of their own (a first run, a simulated host), some
    in a network namespace with no route to Maven. STREAMTRAIN_KAFKA_HOME points them at a
    distribution-like folder whose ``libs`` are the resolved jars. Where the jars cannot be
    had, nothing is set and the tests that start a broker say why."""
    from pipeline.errors import StreamtrainError
    from pipeline.ingest.kafka import engines

    try:
        jars = Path(engines.kafka_classpath().split(os.pathsep)[0]).parent
    except StreamtrainError:
        return
    home = tmp_path_factory.mktemp("kafka-home")
    (home / "libs").symlink_to(jars, target_is_directory=True)
    os.environ["STREAMTRAIN_KAFKA_HOME"] = str(home)


@pytest.fixture(autouse=True)
def _fallback_consumers_closed() -> Iterator[None]:
    """The consumer fallback's cached consumers are closed after each test: the test's broker
    may stop next, and an open consumer would go on reconnecting to its port (a Spark worker's
    connect-back socket got one's TLS hello there and failed a query)."""
    yield
    reader = sys.modules.get("pipeline.ingest.reader")
    if reader is not None:
        reader.close_consumers()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """Apache Kafka's own broker (KRaft), shared by the session: what users run. The embedded
    engines that start in milliseconds keep their own tests (test_client_compat, test_broker,
    the quickstart's run)."""
    log = tmp_path_factory.mktemp("broker") / "kafka.log"
    with EmbeddedBroker(engine="kafka", log_path=log) as b:
        yield b


@pytest.fixture(scope="session")
def raw_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A broker that stores each batch as it is sent (Tansu), for the tests of a log holding
    a batch no reader can read. Apache Kafka inflates and checks every batch it is given and
    refuses such a one (INVALID_RECORD, CORRUPT_MESSAGE), so on a real cluster it comes from
    elsewhere: a broker of another make, a damaged disk, a mirror of either."""
    log = tmp_path_factory.mktemp("raw-broker") / "tansu.log"
    with EmbeddedBroker(engine="tansu", log_path=log) as b:
        yield b


#: Both Kafka sources, for tests parametrized over them: Spark's own (the reference) and
#: streamtrain's Python source.
SOURCES = ("jvm", "python")


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    return f"t-{request.node.name[:40].replace('[', '-').replace(']', '')}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The data folder the tests read: the HIGGS sample that travels with the repository."""
    assert config.data_dir() == SAMPLES and (SAMPLES / "higgs").is_dir(), (
        f"no HIGGS sample under {SAMPLES}"
    )
    return SAMPLES


@pytest.fixture(scope="session")
def mnist():  # type: ignore[no-untyped-def]
    """Real MNIST (fetched once into the cache if needed)."""
    from producers import datasets

    return datasets.get("mnist")


@pytest.fixture
def consume(broker: EmbeddedBroker) -> Callable[..., list]:  # type: ignore[type-arg]
    """consume(topic, n) -> the first n records of every partition, in partition/offset order."""

    def _consume(
        topic: str, n: int, *, bootstrap: str | None = None, timeout_s: float = 30.0
    ) -> list:  # type: ignore[type-arg]
        from kafka import TopicPartition

        c = client.consumer(bootstrap or broker.bootstrap, max_partition_fetch_bytes=8 << 20)
        try:
            tps = [TopicPartition(topic, p) for p in client.partitions_for(c, topic)]
            c.assign(tps)
            c.seek_to_beginning(*tps)
            records: list = []  # type: ignore[type-arg]
            deadline = time.monotonic() + timeout_s
            while len(records) < n and time.monotonic() < deadline:
                for batch in c.poll(timeout_ms=200, max_records=100_000).values():
                    records.extend(batch)
            return sorted(records, key=lambda r: (r.partition, r.offset))
        finally:
            c.close()

    return _consume


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    """A real local Spark (2 cores), once per session, with Spark's own Kafka source on its
    classpath (resolved once into the cache): the tests run both sources."""
    from pipeline import cluster

    s = cluster.session("local[2]", app="streamtrain-tests", source="jvm")
    yield s
    cluster.stop(s)


def free_port() -> int:
    """A loopback port nobody listens on right now, which no outgoing connection will take."""
    from pipeline.ingest.kafka.broker import free_port as free

    return free()


def _need(binary: str) -> str:
    """The path of a Debian binary the README's test command installs; skip where it
    cannot be had, but never in CI, where a skip would hide a missing check."""
    import os
    import shutil

    path = shutil.which(binary)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(
                f"{binary} is not installed; tests/run.sh installs Debian's prometheus package in "
                "CI"
            )
        pytest.skip(f"{binary} not installed (apt-get install prometheus, as root)")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return _need("promtool")


class Prometheus:
    """A real Prometheus on a free loopback port, scraping ``targets`` every second."""

    def __init__(self, folder: Path, targets: dict[str, list[str]], rule_files: list[Path]) -> None:
        import json
        import subprocess

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        jobs = [
            {"job_name": job, "static_configs": [{"targets": addrs}]}
            for job, addrs in targets.items()
        ]
        cfg = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(r) for r in rule_files],
            "scrape_configs": jobs,
        }
        (folder / "prometheus.yml").write_text(json.dumps(cfg))  # JSON is YAML
        self.log = open(folder / "prometheus.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                _need("prometheus"),
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--web.enable-lifecycle",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout_s: float = 30.0) -> None:
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited {self.proc.returncode}"
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise AssertionError("prometheus did not become ready")

    def api(self, path: str) -> dict:  # type: ignore[type-arg]
        import json
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/api/v1/{path}", timeout=10) as r:
            body: dict = json.load(r)  # type: ignore[type-arg]
        assert body["status"] == "success", body
        return body["data"]  # type: ignore[no-any-return]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except Exception:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Prometheus]]:
    """prometheus(targets, rule_files=[]) -> a running Prometheus; stopped after the module."""
    started: list[Prometheus] = []

    def start(targets: dict[str, list[str]], rule_files: list[Path] | None = None) -> Prometheus:
        folder = tmp_path_factory.mktemp("prometheus")
        p = Prometheus(folder, targets, rule_files or [])
        started.append(p)
        return p

    yield start
    for p in started:
        p.stop()


#: Test files that run longest (measured on 2 cores, the slowest machine seen), longest first.
#: Under pytest-xdist (tests/run.sh runs two workers, a file to one worker) they start first:
#: the containers wait on Podman and the stack more than they compute, so the other worker's
#: tests fill those waits; and no long file starts last, leaving one worker alone at the end.
LONGEST_FIRST = (
    "tests/deploy/test_containers.py",
    "tests/jobs/test_faults.py",
    "tests/cluster/test_compose_rehearsal.py",
    "tests/observe/test_steady_panels.py",
    "tests/jobs/test_stop.py",
    "tests/cluster/test_cluster_guide.py",
    "tests/jobs/test_id_features.py",
    "tests/jobs/test_trainer.py",
    "tests/jobs/test_secure_run.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    # A stable sort: within a file, and among the other files, the order stays as written.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


_left_out: list[str] = []
#: Under xdist the workers collect and deselect; the controller hears their counts here.
_left_out_by_workers: list[int] = []


def pytest_deselected(items: list[pytest.Item]) -> None:
    _left_out.extend(item.nodeid for item in items if item.get_closest_marker("slow"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    output = getattr(session.config, "workeroutput", None)  # set on an xdist worker only
    if output is not None:
        output["left_out"] = len(_left_out)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: without xdist, nothing calls it
def pytest_testnodedown(node: Any, error: Any) -> None:
    _left_out_by_workers.append(getattr(node, "workeroutput", {}).get("left_out", 0))


#: A test that needs more than this says why in its docstring (or its class's or module's), in
#: a sentence that starts "Slow": the suite's time is spent on purpose or not at all.
SLOW_S = 60.0


def _says_why_slow(item: pytest.Item) -> bool:
    docs = [getattr(getattr(item, name, None), "__doc__", None) for name in ("function", "cls")]
    docs.append(getattr(item.module, "__doc__", None) if isinstance(item, pytest.Function) else "")
    return any(re.search(r"(^|\.\s|\n)\s*Slow\b", doc or "") for doc in docs)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":  # carried to xdist's controller with the report
        report.user_properties.append(("says_why_slow", _says_why_slow(item)))


def _test_reports(reporter: pytest.TerminalReporter) -> Iterator[pytest.TestReport]:
    """Every test's set-up, call and tear-down report, whatever its outcome."""
    for reports in reporter.stats.values():
        yield from (r for r in reports if isinstance(r, pytest.TestReport))


def _slow_without_reason(reporter: pytest.TerminalReporter) -> list[str]:
    """Tests over SLOW_S (set-up, call and tear-down) whose docstrings do not say why."""
    spent: dict[str, float] = {}
    unexplained = set()
    for r in _test_reports(reporter):
        spent[r.nodeid] = spent.get(r.nodeid, 0.0) + r.duration
        if any(list(p) == ["says_why_slow", False] for p in r.user_properties):
            unexplained.add(r.nodeid)
    over = sorted((n for n in unexplained if spent[n] > SLOW_S), key=lambda n: -spent[n])
    return [f"{spent[n]:.0f} s {n}" for n in over]


def _tier_seconds(reporter: pytest.TerminalReporter) -> dict[str, float]:
    """Seconds of test time (set-up, call, tear-down) in each tier, from every report."""
    totals = {"quick": 0.0, "slow": 0.0}
    for r in _test_reports(reporter):
        totals["slow" if "slow" in r.keywords else "quick"] += r.duration
    return totals


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Each tier's test time, and what a quick tier (``-m "not slow"``) left out, so nobody
    mistakes it for the suite."""
    tiers = _tier_seconds(terminalreporter)
    workers = getattr(terminalreporter.config.option, "numprocesses", None) or 1
    terminalreporter.write_line(
        f"tiers: quick {tiers['quick']:.0f} s, slow {tiers['slow']:.0f} s of test time "
        f"over {workers} worker{'s' * (workers > 1)}"
    )
    for line in _slow_without_reason(terminalreporter):
        terminalreporter.write_line(
            f"over {SLOW_S:.0f} s without a 'Slow: why' in its docstring: {line}"
        )
    left_out = max([len(_left_out), *_left_out_by_workers])
    if left_out:
        terminalreporter.write_line(
            f"quick tier: left out {left_out} slow tests (full runs, clusters, containers, "
            "soak-like, timeouts to wait out, brokers of their own); `bash tests/run.sh` runs "
            "them all"
        )
