"""The dashboard, its provisioning and the alert rules, checked offline; `dashboards push`
against an HTTP stand-in for Grafana (Grafana itself cannot run on this machine)."""

from __future__ import annotations

import base64
import http.server
import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.errors import ConfigError
from pipeline.observe import dashboard, metrics, refusals
from pipeline.observe.metrics.pace import PaceMeters
from pipeline.observe.metrics.tables import TableMeters
from tests.conftest import ROOT, free_port

DEPLOY = ROOT / "deploy"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def _exported_names() -> set[str]:
    """Every sample name streamtrain's registries expose (with _bucket, _count, ...)."""
    names = set()
    training = metrics.training_metrics().registry
    TableMeters(training)  # the ID tables' metrics, on the trainer's registry
    PaceMeters(training)  # the run's pace against its stream, too
    for registry in (
        training,
        metrics.producer_metrics().registry,
        metrics.serving_metrics("m").registry,
    ):
        for family in registry.collect():
            names.add(family.name)
            names.update(s.name for s in family.samples)
            kind = family.type
            if kind == "counter":
                names.add(family.name + "_total")
            if kind == "histogram":
                names.update(family.name + suffix for suffix in ("_bucket", "_count", "_sum"))
    return names


def test_committed_dashboard_is_what_the_code_builds() -> None:
    committed = json.loads(dashboard.DEFAULT_FILE.read_text())
    assert committed == dashboard.build(), (
        "run `streamtrain dashboards build` and commit dashboards/streamtrain.json"
    )
    dashboard.validate(committed)


def test_validate_refuses_what_grafana_would_not_read() -> None:
    with pytest.raises(ConfigError, match="does not parse as a Grafana dashboard"):
        dashboard.validate({"title": "x", "panels": "not a list"})


def test_every_query_names_only_metrics_streamtrain_exports() -> None:
    exported = _exported_names()
    board = dashboard.build()
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    exprs = [e for _, e, _ in dashboard.queries(board)]
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = {name for e in exprs for name in re.findall(r"\bstreamtrain_[a-z_]+", e)}
    assert used and not used - exported, used - exported


def test_dashboard_answers_the_three_questions_with_one_datasource() -> None:
    board = dashboard.build()
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == [
        "At a glance",
        "Is data flowing?",
        "Is training healthy?",
        "Serving",
        "What was rejected, and why?",
        "Predict stream (streamtrain predict)",
        "ID tables (embedding rows on the parameter server)",
    ]
    panels = dashboard.panels(board)
    assert {p["datasource"]["uid"] for p in panels} == {dashboard.DATASOURCE_UID}
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])
    # Panels tile Grafana's 24-column grid without overlapping.
    cells = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, p["title"]
        cells |= mine


#: Which `streamtrain` command feeds each family of metrics.
_FED_BY = {
    "producer": "produce",
    "stream": "run",
    "train": "run",
    "ps": "run",
    "eval": "run",
    "worker": "run",
    "run": "run",
    "model": "run",
    "drift": "run",
    "serve": "--serve-port",
    "predictions": "predict",
    "id": "run --schema with ID features",
}


def test_an_open_row_shows_only_what_the_compose_stack_feeds() -> None:
    """Proves: every panel Grafana shows open in the compose stack has a service feeding it;
    the predict stream's (`streamtrain predict`, which the stack does not run) sits in a
    collapsed row, instead of an open panel that stays empty."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    commands = " ".join(
        " ".join(map(str, s.get("command", []))) for s in compose["services"].values()
    )
    board = dashboard.build()
    open_panels = [
        p for p in board["panels"] if p["type"] != "row"
    ]  # a collapsed row nests its own
    assert open_panels
    unfed = set()
    for p in open_panels:
        for t in p["targets"]:
            for family in re.findall(r"\bstreamtrain_([a-z]+)_", t["expr"]):
                if _FED_BY[family] not in commands.split():
                    unfed.add(p["title"])
    assert not unfed, unfed
    collapsed = [p for p in board["panels"] if p["type"] == "row" and p.get("collapsed")]
    assert [q["title"] for r in collapsed for q in r["panels"]][:2] == [
        "Predictions written per second (predict stream)",
        "Rows per table",  # the ID tables' row: only a schema with ID features fills it
    ]


def test_grafana_provisioning_names_the_dashboards_datasource() -> None:
    sources = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "streamtrain.yml").read_text()
    )
    assert [s["uid"] for s in sources["datasources"]] == [dashboard.DATASOURCE_UID]
    assert sources["datasources"][0]["type"] == "prometheus"
    providers = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "streamtrain.yml").read_text()
    )
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


@pytest.mark.parametrize(
    "args",
    [
        ["check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
        ["check", "rules", str(DEPLOY / "prometheus" / "alerts.yml")],
        ["test", "rules", str(DEPLOY / "prometheus" / "alerts_test.yml")],
    ],
)
def test_promtool_accepts_the_deployment(promtool: str, args: list[str]) -> None:
    done = subprocess.run(
        [promtool, *args], capture_output=True, text=True, cwd=DEPLOY / "prometheus"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_promtool_test_rules_can_fail(promtool: str, tmp_path: Path) -> None:
    """The rule tests have teeth: a rule that never fires fails them."""
    rules = (DEPLOY / "prometheus" / "alerts.yml").read_text().replace("for: 3m", "for: 30m")
    (tmp_path / "alerts.yml").write_text(rules)
    (tmp_path / "alerts_test.yml").write_text(
        (DEPLOY / "prometheus" / "alerts_test.yml").read_text()
    )
    done = subprocess.run(
        [promtool, "test", "rules", "alerts_test.yml"], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode != 0 and "StreamtrainTrainingStalled" in done.stdout + done.stderr


# --- dashboards push, against a recording stand-in for Grafana's HTTP API -------------------


class _FakeGrafana(http.server.BaseHTTPRequestHandler):
    requests: list[dict[str, Any]]
    existing: set[str]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.requests.append(
            {
                "method": self.command,
                "path": self.path,
                "auth": self.headers.get("Authorization"),
                "body": body,
            }
        )
        path = self.path.split("?")[0]
        status, answer = 200, {"message": "ok"}
        if self.command == "GET" and path not in self.existing:
            status, answer = 404, {"message": "not found"}
        elif self.command == "POST" and path == "/api/datasources":
            self.existing.add(f"/api/datasources/uid/{body['uid']}")
        elif self.command == "POST" and path == "/api/folders":
            self.existing.add(f"/api/folders/{body['uid']}")
        elif self.command == "POST" and path == "/api/dashboards/db":
            answer = {
                "status": "success",
                "uid": body["dashboard"]["uid"],
                "url": "/d/streamtrain-overview/x",
            }
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def grafana() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    handler = type("Handler", (_FakeGrafana,), {"requests": [], "existing": set()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}", handler.requests  # type: ignore[attr-defined]
    server.shutdown()


def test_push_uploads_datasource_folder_and_dashboard(
    grafana: tuple[str, list[dict[str, Any]]],
) -> None:
    address, seen = grafana
    done = _cli(
        "dashboards",
        "push",
        "--grafana-url",
        f"http://admin:s3cret@{address}",
        "--prometheus-url",
        "http://prometheus:9090",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "s3cret" not in done.stdout + done.stderr
    assert f"http://admin:***@{address}/d/streamtrain-overview/x" in done.stdout
    calls = [(r["method"], r["path"]) for r in seen]
    assert ("POST", "/api/datasources") in calls and ("POST", "/api/folders") in calls
    assert calls[-1] == ("POST", "/api/dashboards/db")
    assert all(r["auth"] == "Basic " + base64.b64encode(b"admin:s3cret").decode() for r in seen)
    source = next(r["body"] for r in seen if r["path"] == "/api/datasources")
    assert source["uid"] == dashboard.DATASOURCE_UID and source["url"] == "http://prometheus:9090"
    upload = seen[-1]["body"]
    assert upload["overwrite"] is True and upload["folderUid"] == "streamtrain"
    assert upload["dashboard"]["uid"] == dashboard.DASHBOARD_UID
    assert dashboard.queries(upload["dashboard"]) == dashboard.queries(dashboard.build())

    # A second push updates the datasource in place instead of creating another.
    seen.clear()
    again = _cli(
        "dashboards", "push", "--grafana-url", f"http://{address}", env={"GRAFANA_TOKEN": "tok-123"}
    )
    assert again.returncode == 0, again.stderr[-2000:]
    calls = [(r["method"], r["path"]) for r in seen]
    assert ("PUT", f"/api/datasources/uid/{dashboard.DATASOURCE_UID}") in calls
    assert ("POST", "/api/datasources") not in calls and ("POST", "/api/folders") not in calls
    assert all(r["auth"] == "Bearer tok-123" for r in seen)
    assert "tok-123" not in again.stdout + again.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["dashboards", "push", "--grafana-url", "http://admin:pw@127.0.0.1:1"],
            "Cannot upload to Grafana at http://admin:***@127.0.0.1:1",
        ),
        (
            ["dashboards", "render", "--prometheus", "http://127.0.0.1:1"],
            "Cannot reach Prometheus at http://127.0.0.1:1",
        ),
        (["dashboards", "render", "--since", "soon"], "Expected a duration such as 90s"),
        (
            ["dashboards", "push", "--grafana-url", "http://x", "--dashboard", "missing.json"],
            "Expected a Grafana dashboard JSON file at missing.json",
        ),
    ],
)
def test_dashboard_commands_fail_with_one_clear_line(args: list[str], message: str) -> None:
    done = _cli(*args)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "pw@" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("streamtrain: error:")]
    assert len(errors) == 1 and message in errors[0], done.stderr[-2000:]


def test_build_writes_the_dashboard(tmp_path: Path) -> None:
    done = _cli("dashboards", "build", "--out", str(tmp_path / "d.json"))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "d.json").read_text()) == dashboard.build()
    assert f"{len(dashboard.panels(dashboard.build()))} panels written" in done.stdout


def test_the_operating_guide_names_every_alert_and_only_those() -> None:
    """Proves: docs/operating.md's alert list is alerts.yml's (the README once named five of
    six)."""
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    guide = (ROOT / "docs" / "operating.md").read_text()
    assert set(re.findall(r"`(Streamtrain[A-Za-z]+)`", guide)) == alerts
    words = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
    assert f"has {words[len(alerts)]} alerts" in guide


def test_every_panel_that_can_alarm_has_thresholds_and_every_rate_a_minute() -> None:
    """Proves: stat panels are coloured by thresholds (the alerts' own bounds where there is
    one), and every rate spans a minute at least (several micro-batches)."""
    panels = {p["title"]: p for p in dashboard.panels(dashboard.build())}
    steps = {
        t: [s["value"] for s in p["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])]
        for t, p in panels.items()
    }
    assert all(len(steps[t]) >= 2 for t, p in panels.items() if p["type"] == "stat"), steps
    assert steps["Staleness p99"][-1] == 32 and steps["Consumer lag"][1] == 10_000
    for title, p in panels.items():
        if any("rate(" in t["expr"] for t in p["targets"]):
            assert dashboard.rate_window(p, 5) >= 65, title
    assert panels["Busy workers: compute vs exchange"]["fieldConfig"]["defaults"]["unit"] != "s"


def test_every_refusal_reason_the_model_server_gives_is_declared() -> None:
    """Proves: SERVE_REFUSALS, which a model server creates at 0, holds every reason its
    code gives (tests/serve/test_http.py checks they exist before the first refusal)."""
    source = "".join(p.read_text() for p in (ROOT / "pipeline" / "serve").glob("*.py"))
    given = set(re.findall(r'reason="([a-z_]+)"', source)) | set(
        re.findall(r'bad_requests\.labels\([^,]+, "([a-z_]+)"\)', source)
    )
    assert given and given <= set(refusals.SERVE_REFUSALS), given - set(refusals.SERVE_REFUSALS)
