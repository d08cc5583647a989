"""The shipped operations files: Prometheus rules (promtool), the Grafana dashboard and its
provisioning, and that every metric they name is one we export or document relying on."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "dspark-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "dspark-rules.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "gpustack-dspark.json"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
METRICS_DOC = ROOT / "docs" / "metrics.md"
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$model": ".*", "${datasource}": "prometheus"}
NOT_NAMES = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan"}


def promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: run `make setup` (Debian's prometheus package)"
    return found


def metric_names(expr: str) -> set:
    """Metric names a PromQL expression reads (functions, keywords, labels removed)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        if expr[match.end():].lstrip().startswith("(") or match.group() in NOT_NAMES:
            continue
        if match.start() > 0 and (expr[match.start() - 1].isdigit() or expr[match.start() - 1] == "."):
            continue  # 1e3 and the like
        names.add(match.group())
    return names


def documented() -> set:
    """First-column backticked names of the tables in docs/metrics.md."""
    names = set()
    for line in METRICS_DOC.read_text().splitlines():
        match = re.match(r"\|\s*`([a-zA-Z_:][a-zA-Z0-9_:]*)`", line)
        if match:
            names.add(match.group(1))
    return names


def _known(name: str, names: set) -> bool:
    return name in names or re.sub(r"_(bucket|sum|count)$", "", name) in names


def dashboard_exprs():
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for var, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(var, value)
            exprs.append(expr)
    return exprs


def rule_exprs():
    return [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules():
    result = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 16 rules found" in result.stdout


def test_promtool_rule_unit_tests_fire_and_stay_silent():
    result = subprocess.run([promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True,
                            cwd=RULE_TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = {t["alertname"] for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for t in test.get("alert_rule_test", [])}
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    assert tested == alerts


def test_rule_tests_can_fail(tmp_path):
    """The same tests against rules with a wrong threshold must fail."""
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    (tmp_path / RULES.name).write_text(RULES.read_text().replace("< 0.6", "< 0.2"))
    result = subprocess.run([promtool(), "test", "rules", RULE_TESTS.name], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode != 0 and "DSparkAcceptanceRateLow" in result.stdout + result.stderr


def test_example_prometheus_config_is_valid():
    config = ROOT / "deploy" / "prometheus" / "prometheus.yml"
    result = subprocess.run([promtool(), "check", "config", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_has_grafana_provisioning_shape():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    assert "__inputs" not in dashboard  # provisioned dashboards are not import templates
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) and ids
    for panel in dashboard["panels"]:
        assert panel["type"] in {"timeseries", "stat", "table", "bargauge", "gauge"}, panel["title"]
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["refId"] and target["expr"] and target["datasource"]["uid"] == "${datasource}"
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("tokens/s", "p50 / p99", "acceptance", "tokens per forward", "format errors", "in-flight",
                  "warmup"):
        assert topic in titles, topic


def test_provisioning_points_at_the_dashboard():
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "gpustack-dspark.yaml").read_text())
    assert provider["apiVersion"] == 1
    (entry,) = provider["providers"]
    assert entry["type"] == "file" and entry["options"]["path"].endswith("/" + DASHBOARD.stem)
    datasource = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    assert datasource["datasources"][0]["type"] == "prometheus"


def test_dashboard_queries_parse(tmp_path):
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dspark_dashboard_query_{i}", "expr": e} for i, e in enumerate(dashboard_exprs())]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_queried_metric_is_documented():
    names = documented()
    for expr in dashboard_exprs() + rule_exprs():
        unknown = {n for n in metric_names(expr) if not _known(n, names)}
        assert not unknown, (expr, unknown)
    assert metric_names('sum by (model_name, le) (rate(vllm:x_bucket{a="b"}[5m])) > on() group_left() y') == {
        "vllm:x_bucket", "y"}


def test_every_exported_dspark_metric_is_documented(monkeypatch):
    from gpustack_dspark.knobs import DSparkKnobs
    from gpustack_dspark.routing.format_middleware import FormatStats
    from gpustack_dspark.routing.inflight import InFlightTracker
    from gpustack_dspark.routing.metrics import RoutingCollector
    from gpustack_dspark.translate import LaunchPlan
    from gpustack_dspark.worker import metrics as worker_metrics, state as worker_state

    state = worker_state.WorkerState(plan=LaunchPlan(vllm_argv=[], enabled=True), knobs=DSparkKnobs())
    state.warmup.started_at = 1.0
    monkeypatch.setattr(worker_state, "_current", state)
    stats = FormatStats()
    stats.record("m", 1, "not_json")
    tracker = InFlightTracker()
    tracker.acquire(1, 1)
    registry = CollectorRegistry()
    registry.register(worker_metrics.DSparkWorkerCollector())
    registry.register(RoutingCollector(tracker, lambda: {"json": 1}, lambda: {"retried": 1}, stats.snapshot))
    from gpustack_dspark.worker.drafting.stats import DraftingCounters, metric_families

    class Drafting:
        def collect(self):
            from gpustack_dspark.worker.drafting.budget import SpeculationBudget

            budget = SpeculationBudget()
            budget.time.observe(3, 0.01)
            budget.acceptance.observe(["forced"], [1.0], 1, 1)
            budget.cutoff = 0.5
            return metric_families(DraftingCounters(forced_proposed=1), "m", budget.snapshot())

    registry.register(Drafting())
    exported = {line.split("{")[0].split(" ")[0] for line in generate_latest(registry).decode().splitlines()
                if line and not line.startswith("#")}
    exported = {n for n in exported if not n.endswith("_created")}
    assert exported and exported <= documented(), exported - documented()
