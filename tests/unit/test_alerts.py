"""The example alert rules and Grafana dashboard (deploy/, docs/observability.md "Alerts and
dashboard"), checked with promtool: the rules load, each alert fires on the series that should
fire it and stays quiet on healthy ones (deploy/prometheus/a2a-alerts.test.yml), every PromQL
expression of the dashboard parses, and both speak only of the metric families /metrics
exposes. `make test` installs promtool (`make promtool`); without it these tests fail."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "a2a-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "a2a-alerts.test.yml"
SCRAPE = ROOT / "deploy" / "prometheus" / "scrape.example.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "a2a-platform.json"
OBSERVABILITY = ROOT / "docs" / "observability.md"

# The families /metrics exposes (docs/observability.md), by type: a histogram is read through
# its _bucket, _count and _sum series.
COUNTERS = {
    "a2a_webhook_deliveries_total",
    "a2a_task_transitions_total",
    "a2a_executor_failures_total",
}
GAUGES = {
    "a2a_webhook_backlog",
    "a2a_webhook_oldest_pending_seconds",
    "a2a_webhook_dead_letters",
    "a2a_webhook_endpoints_breaker_open",
    "a2a_tasks_in_flight",
    "a2a_readiness",
    "a2a_workers_live",
    "a2a_rebind_tasks_on_old_version",
    "a2a_rebind_drain_deadline_ratio",
}
HISTOGRAMS = {"a2a_webhook_delivery_latency_seconds", "http_server_request_duration_seconds"}
FAMILIES = COUNTERS | GAUGES | HISTOGRAMS
ALERTS = {
    "A2AWebhookBacklogOld",
    "A2AWebhookDeadLettersRising",
    "A2ANoLiveWorker",
    "A2AReadinessDown",
    "A2ARebindDrainNearDeadline",
}

# PromQL words that are not metric names: functions and aggregations are followed by "(",
# these are not always.
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan",
}  # fmt: skip
# Grafana's variables, as Grafana substitutes them before the query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$agent": ".*"}


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    path = shutil.which("promtool")
    assert path, (
        "promtool is missing: `make promtool` (as root) installs it from Debian's prometheus "
        "package; `make test` does so itself"
    )
    return subprocess.run(
        [path, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def families_in(expr: str) -> set[str]:
    """The metric families an expression reads: its names with label matchers, strings, ranges,
    grouping lists and function calls taken out; a histogram's series named by their family."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w.:])[A-Za-z_:][\w:]*", text):
        word = match.group(0)
        if word.lower() in KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue
        names.add(re.sub(r"_(bucket|count|sum)$", "", word) if word not in FAMILIES else word)
    return names


def dashboard_targets() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (f"{panel['title']} {target['refId']}", target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def test_families_in_reads_names_not_labels_functions_or_keywords():
    expr = (
        'histogram_quantile(0.99, sum by (le, http_route) (rate('
        'http_server_request_duration_seconds_bucket{http_route="/x"}[5m]))) '
        "or on (queue) absent(a2a_workers_live{queue=\"agents\"}) > bool 0 "
        "unless up offset 5m"
    )  # fmt: skip
    assert families_in(expr) == {"http_server_request_duration_seconds", "a2a_workers_live", "up"}


def test_alert_rules_load():
    checked = promtool("check", "rules", RULES.name, cwd=RULES.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 5 rules found" in checked.stdout


def test_alert_rules_fire_on_their_series_and_stay_quiet_on_healthy_ones():
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # Every alert is tested, as firing at least once and as quiet at least once.
    cases = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    checks = [check for case in cases for check in case["alert_rule_test"]]
    assert {c["alertname"] for c in checks if c["exp_alerts"]} == ALERTS
    assert {c["alertname"] for c in checks if not c["exp_alerts"]} == ALERTS


def test_each_alert_says_what_fired_how_bad_and_where_its_runbook_is():
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    assert {rule["alert"] for rule in rules} == ALERTS
    headings = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in OBSERVABILITY.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in rules:
        assert rule["for"], rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        notes = rule["annotations"]
        assert notes.keys() >= {"summary", "description", "runbook"}, rule["alert"]
        # Named by what it is about (the agent, queue, check or rebind the series carries).
        assert "{{ $labels." in notes["summary"], rule["alert"]
        page, _, anchor = notes["runbook"].partition("#")
        assert page == "docs/observability.md", rule["alert"]
        assert anchor in headings, f"{rule['alert']}: no section #{anchor} in {page}"
        assert families_in(rule["expr"]) <= FAMILIES, rule["alert"]


def test_scrape_example_is_a_valid_prometheus_configuration():
    checked = promtool("check", "config", SCRAPE.name, cwd=SCRAPE.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_dashboard_reads_every_family_and_nothing_else():
    targets = dashboard_targets()
    assert targets
    read = set()
    for name, expr in targets:
        families = families_in(expr)
        assert families, f"{name}: reads no metric"
        assert families <= FAMILIES, f"{name}: {families - FAMILIES} is not a /metrics family"
        read |= families
    assert read == FAMILIES, f"no panel shows {FAMILIES - read}"


def test_dashboard_queries_parse(tmp_path):
    # promtool parses PromQL without a server when it checks rules: each query becomes a
    # recording rule, Grafana's variables replaced as Grafana replaces them.
    rules = []
    for index, (_name, expr) in enumerate(dashboard_targets()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"an unknown Grafana variable in {expr!r}"
        rules.append({"record": f"dashboard:query_{index}", "expr": expr})
    generated = tmp_path / "dashboard-queries.yml"
    generated.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = promtool("check", "rules", generated.name, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


def test_dashboard_has_a_datasource_and_an_agent_variable_every_panel_uses():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["agent"]["includeAll"] is True
    assert variables["agent"]["multi"] is True
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            # A per-agent family is filtered by the agent variable.
            if families_in(target["expr"]) & {f for f in FAMILIES if "agent" in _labels(f)}:
                assert 'agent=~"$agent"' in target["expr"], panel["title"]


def _labels(family: str) -> set[str]:
    per_agent = {
        "a2a_webhook_deliveries_total",
        "a2a_webhook_delivery_latency_seconds",
        "a2a_webhook_backlog",
        "a2a_webhook_oldest_pending_seconds",
        "a2a_webhook_dead_letters",
        "a2a_webhook_endpoints_breaker_open",
        "a2a_task_transitions_total",
        "a2a_tasks_in_flight",
        "a2a_executor_failures_total",
    }
    return {"agent"} if family in per_agent else set()
