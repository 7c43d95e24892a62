"""The dashboard and the alert rules against real parts: Debian's `promtool` checks the
rules and the compose scrape config and runs the rules' unit tests; a real Prometheus scrapes a real verifier (started
from the shell) under a short load of every kind of call, and every dashboard panel's
query and every alert's expression returns data through Prometheus's HTTP API."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from cli_harness import generate_json, verifier
from conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "acespec-verifier.json"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
if PROMETHEUS is None or PROMTOOL is None:
    if os.environ.get("ACESPEC_REQUIRE_PROMETHEUS"):
        raise RuntimeError("prometheus and promtool are required (ACESPEC_REQUIRE_PROMETHEUS "
                           "is set) but not installed")
    pytest.skip("Prometheus is not installed (scripts/install.sh installs Debian's "
                "prometheus)", allow_module_level=True)

# Grafana's variables, as a dashboard user with the default job and every verifier sees them
GRAFANA_VARS = {"$__rate_interval": "1m", "$job": "acespec-verifier", "$instance": ".*"}


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query of the dashboard, its variables filled in."""
    out = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_VARS.items():
                expr = expr.replace(var, value)
            out.append((panel["title"], expr))
    return out


def documented_queries() -> list[str]:
    """The PromQL column of docs/deploy.md's metric tables (a row's first code span there).
    Left out: the per-client gauges, which exist only while their clients' sessions are
    open."""
    out = []
    for line in (ROOT / "docs" / "deploy.md").read_text().splitlines():
        cells = re.split(r"(?<!\\)\|", line)
        if len(cells) == 5 and cells[1].strip().startswith(("`acespec_", "`process_")):
            expr = re.search(r"`([^`]+)`", cells[3]).group(1).replace("\\|", "|")
            if "acespec_client_" not in expr:
                out.append(expr)
    return out


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def as_bool(expr: str) -> str:
    """An alert's expression with each comparison against a number made a `bool` one: the
    compared query's value (0 or 1) for every series it has, firing or not."""
    return re.sub(r"\s(==|!=|>=|<=|>|<)\s+(?=-?[\d.])", r" \1 bool ", expr)


def test_promtool_checks_the_rules_and_the_compose_config():
    for args in (["check", "rules", str(RULES)],
                 ["check", "config", str(ROOT / "deploy" / "prometheus" / "compose.yml")]):
        p = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
    assert {r["alert"] for r in alert_rules()} == {
        "AceSpecVerifierDown", "AceSpecTPGroupLost", "AceSpecKVPoolNearFull",
        "AceSpecTTFTHigh", "AceSpecErrorRate"}


def test_each_alert_fires_on_its_condition_and_only_then():
    """promtool's rule unit tests (tests/data/alerts_test.yml): every alert, on series that
    should fire it and on a healthy fleet."""
    cases = ROOT / "tests" / "data" / "alerts_test.yml"
    p = subprocess.run([PROMTOOL, "test", "rules", str(cases)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and "SUCCESS" in p.stdout, p.stdout + p.stderr
    fired = {t["alertname"] for case in yaml.safe_load(cases.read_text())["tests"]
             for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert fired == {r["alert"] for r in alert_rules()}


def test_every_documented_metric_has_its_query():
    assert len(documented_queries()) >= 18


def test_every_alert_expression_compares_with_a_number():
    """The test below reads an alert's query through as_bool: each must have one."""
    for rule in alert_rules():
        assert as_bool(rule["expr"]) != rule["expr"], rule["alert"]


class Prometheus:
    """A real Prometheus scraping `targets` every second, with the alert rules loaded."""

    def __init__(self, tmp: Path, targets: list[str]):
        self.port = free_port()
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                  "rule_files": [str(RULES)],
                  "scrape_configs": [{"job_name": "acespec-verifier",
                                      "static_configs": [{"targets": targets}]}]}
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(tmp / "prometheus.log", "w")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).read()
                return
            except OSError:
                assert self.p.poll() is None, (tmp / "prometheus.log").read_text()
                time.sleep(0.1)
        raise AssertionError("Prometheus was not ready within 60 s")

    def api(self, path: str, **params: str) -> object:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        body = json.loads(urllib.request.urlopen(url, timeout=30).read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data)
        return data["result"]

    def wait_for(self, expr: str, timeout: float = 60) -> None:
        """Until `expr` has a result."""
        deadline = time.monotonic() + timeout
        while not self.query(expr):
            assert time.monotonic() < deadline, f"no result for {expr} within {timeout} s"
            time.sleep(0.2)

    def stop(self) -> None:
        self.p.terminate()
        try:
            self.p.wait(15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.log.close()


LOAD = [  # (prompt, flags): each kind of call, each draft source
    ("def fibonacci(n):", ("--mode", "acespec-gap")),  # decided; the gap drafter proposes
    ("import os\nimport sys\n", ("--mode", "acespec")),  # decided; prompt lookup proposes
    ("class Stack:", ("--mode", "acespec-exact", "--sampling", "exact",
                      "--temperature", "0.8")),  # edge-decided
    ("def main():", ("--mode", "ar")),  # cloud-only Generate
]


@pytest.mark.slow
def test_every_panel_and_alert_returns_data_from_a_real_prometheus(tmp_path):
    from acespec.models import DEMO_DRAFTER

    mport = free_port()
    cloud, addr = verifier("--gap-drafter", str(DEMO_DRAFTER), "--metrics-port", str(mport))
    prom = None
    try:
        prom = Prometheus(tmp_path, [f"127.0.0.1:{mport}"])
        prom.wait_for('up{job="acespec-verifier"} == 1')  # scraped before the load, so its
        # rates see the counters rise
        with ThreadPoolExecutor(2) as pool:  # two at a time: requests queue for passes
            runs = list(pool.map(lambda job: generate_json(addr, job[0], *job[1],
                                                           "--max-tokens", "40"), LOAD * 2))
        assert all(len(r["token_ids"]) == 40 for r in runs)
        prom.wait_for(f'timestamp(up{{job="acespec-verifier"}}) > {time.time() + 1:.3f}')
        time.sleep(1.5)  # a scrape after the load, and an evaluation of the rules after it

        empty, nan = [], []
        for title, expr in panel_queries():
            result = prom.query(expr)
            if not result:
                empty.append((title, expr))
            elif not any(math.isfinite(float(s["value"][1])) for s in result):
                nan.append((title, expr, result))
        for expr in documented_queries():
            if not prom.query(expr):
                empty.append(("docs/deploy.md", expr))
        for rule in alert_rules():
            if not prom.query(as_bool(rule["expr"])):
                empty.append((rule["alert"], as_bool(rule["expr"])))
        assert not empty, f"no data: {empty}"
        assert not nan, f"no finite value: {nan}"

        # Every source of drafts was scored, the edge's taken; every call was timed.
        scored = {s["metric"]["source"]: float(s["value"][1]) for s in prom.query(
            'acespec_draft_tokens_total{fate="scored"}')}
        assert set(scored) == {"edge", "lookup", "gap"} and all(scored.values()), scored
        assert prom.query('acespec_draft_tokens_total{source="edge", fate="accepted"} > 0')
        calls = {s["metric"]["kind"]: float(s["value"][1]) for s in prom.query(
            "acespec_request_latency_seconds_count")}
        assert calls == {"decided": 4, "edge_decided": 2, "generate": 2}, calls

        # Prometheus evaluated every rule without an error; a live fleet fires none.
        rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
        assert len(rules) == len(alert_rules())
        assert all(r["health"] == "ok" for r in rules), rules
        assert not [r for r in rules if r["state"] == "firing"], rules
    finally:
        if prom is not None:
            prom.stop()
        cloud.stop()
        cloud.__exit__(None, None, None)


def test_the_compose_profile_scrapes_the_verifier_and_the_edge():
    """docker-compose.yml's observability profile: the image built from the same base as the
    others, the config it reads mounted from deploy/prometheus, its targets the services'
    metrics ports, and the edge answering a scrape addressed to its service name."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    prom = services["prometheus"]
    assert prom["profiles"] == ["observability"]
    assert prom["build"]["args"] == services["cloud"]["build"]["args"]
    dockerfile = (ROOT / prom["build"]["dockerfile"]).read_text()
    assert "ARG BASE=" in dockerfile and "install -y -q --no-install-recommends prometheus" \
        in dockerfile
    host, _, mounted = prom["volumes"][0].partition(":")
    assert (ROOT / host).resolve() == RULES.parent and mounted.startswith("/etc/acespec-prometheus")
    assert "--config.file=/etc/acespec-prometheus/compose.yml" in dockerfile
    config = yaml.safe_load((RULES.parent / "compose.yml").read_text())
    targets = {j["job_name"]: j["static_configs"][0]["targets"] for j in config["scrape_configs"]}
    cloud, edge = services["cloud"]["command"], services["edge"]["command"]
    assert targets["acespec-verifier"] == [f"cloud:{cloud[cloud.index('--metrics-port') + 1]}"]
    assert targets["acespec-edge"] == [f"edge:{edge[edge.index('--port') + 1]}"]
    assert edge[edge.index("--allow-host") + 1] == "edge"
