"""cluster/grafana/tributary.json names only series that exist: Tributary's, as
core.metrics declares them and Ray exports them, and the Ray/Serve series listed in
deployments/metrics.py (a serve test finds those on a live endpoint)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from deployments.core.metrics.metrics import SERIES
from deployments.metrics import RAY_SERIES

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "cluster" / "grafana" / "tributary.json"

# PromQL words that are neither functions (followed by "(") nor series.
KEYWORDS = {
    *("by", "without", "on", "ignoring", "group_left", "group_right"),
    *("bool", "and", "or", "unless", "offset"),
}


def known_series() -> set[str]:
    return set().union(*(s.exported_names() for s in SERIES)) | RAY_SERIES


def series_in(expr: str) -> set[str]:
    """The series an expression selects: every identifier once label matchers, range
    selectors, strings, dashboard variables, numbers and grouping labels are gone, that
    is not a function call or a keyword."""
    text = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers (their values may be anything)
    text = re.sub(r"\[[^\]]*\]", " ", text)  # [5m], [$__rate_interval]
    text = re.sub(r'"[^"]*"', " ", text)
    text = re.sub(r"\$\w+", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\b\d+(\.\d+)?(e\d+)?\b", " ", text)
    names = set()
    for found in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        followed = text[found.end() :].lstrip()
        if not followed.startswith("(") and found.group() not in KEYWORDS:
            names.add(found.group())
    return names


def dashboard_exprs() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    exprs = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            exprs.append((panel["title"], target["expr"]))
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["definition"]
            exprs.append((variable["name"], re.sub(r"label_values\((\w+),.*", r"\1", query)))
    return exprs


def test_the_parser_finds_series_and_only_series() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, priority) (rate(ray_a_bucket{model=~"$model"}'
        "[$__rate_interval]))) / on (model) group_left sum(ray_b_total) * 1048576"
    )
    assert series_in(expr) == {"ray_a_bucket", "ray_b_total"}
    assert series_in('sum(ray_c{Component=~"ray::ServeReplica:.*"}) > bool 2') == {"ray_c"}


def test_every_query_names_only_known_series() -> None:
    known = known_series()
    exprs = dashboard_exprs()
    assert len(exprs) > 20
    unknown = {(title, name) for title, expr in exprs for name in series_in(expr) - known}
    assert unknown == set()
    assert all(series_in(expr) for _, expr in exprs), "a query that selects nothing"


def test_every_recorded_tributary_series_has_a_panel() -> None:
    used = set().union(*(series_in(expr) for _, expr in dashboard_exprs()))
    for series in SERIES:
        assert series.exported_names() & used, series.name


@pytest.mark.parametrize("panel_type", ["timeseries", "heatmap", "stat"])
def test_panels_use_the_datasource_variable(panel_type: str) -> None:
    board = json.loads(DASHBOARD.read_text())
    panels = [p for p in board["panels"] if p["type"] == panel_type]
    assert panels
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_the_prometheus_sample_scrapes_the_make_serve_port() -> None:
    config = yaml.safe_load((ROOT / "cluster" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:8080"]
