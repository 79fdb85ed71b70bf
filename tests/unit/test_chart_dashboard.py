"""The chart's Grafana dashboard: shipped as a ConfigMap when enabled, and every query in it parses as PromQL and
names only series the operator exports (operator/elasticjob/metrics.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
import promql_parser
import pytest
from prometheus_client.metrics import MetricWrapperBase
from test_chart import KUBE_VERSION, RELEASE_NAMESPACE, by_kind, render

from elasticjob import metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "elasticjob-operator" / "dashboards" / "elasticjob.json"
# Grafana replaces its variables before Prometheus sees a query; these stand in for what it would put there.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
# What a Prometheus scrape shows for each type of metric (prometheus_client drops _total from a counter's name).
EXPOSED_AS = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",),
              "summary": ("", "_sum", "_count")}


def exported_series() -> set[str]:
    series = set()
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            for described in value.describe():
                series |= {described.name + suffix for suffix in EXPOSED_AS[described.type]}
    return series


def panels(dashboard: dict) -> list[dict]:
    found = []
    for panel in dashboard["panels"]:
        found += [panel, *panel.get("panels", [])]  # rows hold their panels when collapsed
    return found


def queries(dashboard: dict) -> list[tuple[str, str]]:
    """(panel title, expression) of every query."""
    return [(p["title"], t["expr"]) for p in panels(dashboard) for t in p.get("targets", []) if t.get("expr")]


def series_named(expr: str) -> set[str]:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert not re.search(r"\$\w+", expr), f"an unknown Grafana variable in {expr}"
    names: set[str] = set()

    def visit(node) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            names.add(node.name)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names


def test_the_dashboard_queries_only_series_the_operator_exports():
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_series()
    found = queries(dashboard)
    assert len(found) >= 10
    for title, expr in found:
        named = series_named(expr)
        assert named, f"{title}: {expr} names no metric"
        unknown = named - exported
        assert not unknown, f"panel {title!r} queries {sorted(unknown)}, which metrics.py does not export: {expr}"


def test_series_names_follow_the_types():
    """The check above is only as good as this: a counter is scraped as _total, a histogram as _bucket/_sum/_count."""
    exported = exported_series()
    assert {"elasticjob_reconciles_total", "elasticjob_recovery_seconds_bucket", "elasticjob_recovery_seconds_count",
            "elasticjob_jobs"} <= exported
    assert "elasticjob_reconciles" not in exported and "elasticjob_recovery_seconds" not in exported
    assert series_named("histogram_quantile(0.99, sum by (le) (rate(elasticjob_recovery_seconds_bucket"
                        "[$__rate_interval])))") == {"elasticjob_recovery_seconds_bucket"}
    with pytest.raises(ValueError):
        promql_parser.parse("sum by (le) (rate(elasticjob_recovery_seconds_bucket[5m])")  # unbalanced


@pytest.mark.parametrize("metric", [
    "elasticjob_jobs", "elasticjob_restarts_total", "elasticjob_infrastructure_failures_total",
    "elasticjob_time_to_running_seconds_bucket", "elasticjob_scale_events_total", "elasticjob_recovery_seconds_bucket",
    "elasticjob_reconciles_total", "elasticjob_reconcile_seconds_bucket", "elasticjob_store_actions_total",
    "elasticjob_job_goodput_percent", "elasticjob_lost_seconds_sum", "elasticjob_lost_seconds_count",
])
def test_the_dashboard_shows(metric):
    named = set().union(*(series_named(e) for _, e in queries(json.loads(DASHBOARD.read_text()))))
    assert metric in named


def test_the_goodput_panels_split_the_lost_time_by_phase():
    by_title = dict(queries(json.loads(DASHBOARD.read_text())))
    assert "elasticjob_job_goodput_percent" in by_title["Goodput per job (ETTR)"]
    assert by_title["Training time lost, by phase"].startswith("sum by (phase) (")


def test_panels_use_the_datasource_variable_and_do_not_overlap():
    dashboard = json.loads(DASHBOARD.read_text())
    assert [v["name"] for v in dashboard["templating"]["list"] if v["type"] == "datasource"] == ["datasource"]
    cells = set()
    for panel in panels(dashboard):
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        grid = panel["gridPos"]
        mine = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not mine & cells, f"{panel['title']} overlaps another panel"
        assert grid["x"] + grid["w"] <= 24
        cells |= mine


def test_the_dashboard_configmap_is_rendered_only_when_enabled():
    assert not by_kind(render(), "ConfigMap")
    (configmap,) = by_kind(render({"metrics": {"dashboard": {"enabled": True}}}), "ConfigMap")
    kubernetes_validate.validate(configmap, KUBE_VERSION, strict=True)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert json.loads(configmap["data"]["elasticjob.json"]) == json.loads(DASHBOARD.read_text())
    (elsewhere,) = by_kind(render({"metrics": {"dashboard": {"enabled": True, "namespace": "monitoring",
                                                             "labels": {"team": "ml"}}}}), "ConfigMap")
    assert elsewhere["metadata"]["namespace"] == "monitoring" and elsewhere["metadata"]["labels"]["team"] == "ml"
    assert not by_kind(render({"metrics": {"enabled": False, "dashboard": {"enabled": True}}}), "ConfigMap")
