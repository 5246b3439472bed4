"""Monitoring in deploy/: the Grafana dashboard names only metrics base-serve exports (and its
PromQL parses, through promtool), Prometheus' config passes `promtool check config` and scrapes
exactly the replica and router services of deploy/compose.yml, and the `monitoring` profile starts
Prometheus and Grafana with files that exist.

promtool comes from Debian's prometheus package (tests/run.sh unpacks it into
~/.cache/base-sglang/prometheus); without it the promtool tests are skipped with the reason."""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from deploy_helpers import COMPOSE, ENV_EXAMPLE, ROOT, interpolate, read_env_file

DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "base-sglang.json"
DATASOURCE = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
PROVIDER = DEPLOY / "grafana" / "provisioning" / "dashboards" / "base-sglang.yml"
PROMETHEUS = DEPLOY / "prometheus.yml"

# What base-serve's /metrics exports (server/metrics.py after issue 14), by type.
HISTOGRAMS = {"base_decode_batch_size", "base_decode_batch_budget",
              "base_time_to_first_token_seconds", "base_inter_token_latency_seconds",
              "base_request_queue_time_seconds", "base_request_latency_seconds"}
COUNTERS = {"base_requests_total", "base_request_finish_total", "base_prompt_tokens_total",
            "base_generation_tokens_total", "base_experts_executed_total",
            "base_experts_routed_total"}
GAUGES = {"base_num_requests_running", "base_num_requests_waiting"}
SERIES = COUNTERS | GAUGES | {f"{h}_{s}" for h in HISTOGRAMS for s in ("bucket", "sum", "count")}
# PromQL words that are not metric names (functions are recognised by their parenthesis)
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
            "unless", "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers outside strings, label matchers,
    ranges and grouping clauses that are neither functions nor keywords."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\$\{?\w+\}?", "1", expr)  # Grafana variables
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word, rest = m.group(), expr[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in KEYWORDS or re.fullmatch(r"\d\w*", word):
            continue
        names.add(word)
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions(dashboard: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and templating query."""
    out = [(f"panel {p['title']!r}", t["expr"]) for p in dashboard["panels"]
           for t in p.get("targets", [])]
    for var in dashboard.get("templating", {}).get("list", []):
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        inner = re.fullmatch(r"label_values\((.+),\s*\w+\)", query)
        out.append((f"variable {var['name']}", inner.group(1) if inner else query))
    return out


def test_metric_name_extraction_can_fail():
    assert metric_names('sum by (le) (rate(x_bucket{a="b"}[5m])) / up') == {"x_bucket", "up"}
    assert metric_names("histogram_quantile(0.9, sum(rate(y[$__rate_interval])))") == {"y"}


def test_dashboard_parses_and_names_only_exported_metrics(dashboard):
    assert dashboard["uid"] == "base-sglang" and dashboard["panels"]
    exprs = expressions(dashboard)
    assert len(exprs) >= 20
    used = set()
    for where, expr in exprs:
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        assert names <= SERIES, f"{where}: {sorted(names - SERIES)} are not exported metrics"
        used |= names
    # the panels the issue asks for: tok/s, TTFT/ITL, queue, batch size, batch budget, experts
    for needed in ("base_generation_tokens_total", "base_time_to_first_token_seconds_bucket",
                   "base_inter_token_latency_seconds_bucket", "base_num_requests_waiting",
                   "base_request_queue_time_seconds_bucket", "base_decode_batch_size_bucket",
                   "base_decode_batch_budget_bucket", "base_experts_executed_total",
                   "base_experts_routed_total"):
        assert needed in used, needed


def test_dashboard_panels_use_the_provisioned_datasource(dashboard):
    uid = yaml.safe_load(DATASOURCE.read_text())["datasources"][0]["uid"]
    for p in dashboard["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == uid, p["title"]
            assert all(t["datasource"]["uid"] == uid for t in p["targets"]), p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    provider = yaml.safe_load(PROVIDER.read_text())["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"


def test_prometheus_scrapes_every_replica_and_router_of_compose():
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    jobs = {j["job_name"]: j for j in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]}
    replicas = jobs["base-replicas"]["dns_sd_configs"][0]
    assert sorted(replicas["names"]) == sorted(n for n in services if n.startswith("replica-"))
    assert [str(replicas["port"])] == services["replica-0"]["expose"]
    assert jobs["base-replicas"]["metrics_path"] == "/metrics"
    routers = jobs["router"]["dns_sd_configs"][0]
    assert sorted(routers["names"]) == sorted(n for n in services if n.startswith("router-"))
    entry = services["router-8gpu"]["entrypoint"]
    assert str(routers["port"]) == entry[entry.index("--prometheus-port") + 1]


def test_monitoring_profile_starts_prometheus_and_grafana(compose_schema):
    import jsonschema

    raw = yaml.safe_load(COMPOSE.read_text())
    doc = interpolate(raw, {**read_env_file(ENV_EXAMPLE), "COMPOSE_PROFILES": "8gpu,monitoring"})
    errors = list(jsonschema.validators.validator_for(compose_schema)(compose_schema).iter_errors(doc))
    assert not errors, errors[0].message
    monitoring = {n for n, s in doc["services"].items() if "monitoring" in s.get("profiles", [])}
    assert monitoring == {"prometheus", "grafana"}
    for name in monitoring:
        svc = doc["services"][name]
        assert re.fullmatch(r"[\w.-]+/[\w.-]+:v?\d+\.\d+\.\d+", svc["image"]), svc["image"]
        for vol in svc["volumes"]:
            if isinstance(vol, dict) and vol["type"] == "bind":
                assert (DEPLOY / vol["source"]).exists(), vol["source"]
                assert vol["read_only"] is True
        assert all(p.startswith("127.0.0.1:") for p in svc["ports"])
    prom = doc["services"]["prometheus"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]
    url = yaml.safe_load(DATASOURCE.read_text())["datasources"][0]["url"]
    assert url == "http://prometheus:" + prom["ports"][0].rsplit(":", 1)[1]


def promtool() -> str:
    """promtool on PATH, $BASE_PROMTOOL, or what tests/run.sh unpacked; else skip with why."""
    cached = Path.home() / ".cache" / "base-sglang" / "prometheus" / "usr" / "bin" / "promtool"
    for path in (os.environ.get("BASE_PROMTOOL"), shutil.which("promtool"), str(cached)):
        if path and Path(path).is_file() and os.access(path, os.X_OK):
            return path
    pytest.skip("promtool not found: tests/run.sh unpacks Debian's prometheus package into "
                f"{cached.parents[2]} (apt-get download prometheus && dpkg -x), or set BASE_PROMTOOL")


def test_promtool_accepts_the_prometheus_config(tmp_path):
    tool = promtool()
    out = subprocess.run([tool, "check", "config", str(PROMETHEUS)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(PROMETHEUS.read_text().replace("scrape_interval: 10s", "scrape_interval: ten"))
    out = subprocess.run([tool, "check", "config", str(broken)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0  # the check can fail


def test_promtool_parses_every_dashboard_expression(dashboard, tmp_path):
    """Each expression (Grafana variables filled in) as a recording rule: promtool parses it."""
    tool = promtool()
    rules = [{"record": f"dashboard:expr_{i}",
              "expr": expr.replace("$__rate_interval", "1m").replace("$replica", ".*")}
             for i, (_, expr) in enumerate(expressions(dashboard))]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run([tool, "check", "rules", str(path)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    path.write_text(yaml.safe_dump({"groups": [{"name": "bad", "rules": [
        {"record": "x:y", "expr": "sum(rate(base_requests_total[1m])"}]}]}))
    assert subprocess.run([tool, "check", "rules", str(path)], capture_output=True,
                          timeout=60).returncode != 0
