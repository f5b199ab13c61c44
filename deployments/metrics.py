"""The Recorder of core.metrics onto `ray.serve.metrics`.

Each replica process records into Ray's metric objects; the node's metrics agent
aggregates them and serves Prometheus text on Ray's metrics export port
(`python -m deployments.launch --metrics-port`, 8080 for `make serve`). Ray names the
series `ray_<name>` and adds the Serve labels `deployment`, `replica` and `application`.

`RAY_SERIES` lists the series of Ray and Serve themselves that the Grafana dashboard
(cluster/grafana/tributary.json) uses: a unit test checks that the dashboard names
nothing outside them and `core.metrics.SERIES`, and a serve test finds the CPU ones on
a live server's endpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import ray
from ray.serve import metrics as serve_metrics

from deployments.core.metrics.metric_buffer import BufferedRecorder
from deployments.core.metrics.metrics import Kind, Series, TributaryMetrics

logger = logging.getLogger("ray.serve")

# Exported by Serve on every node (no GPU needed); the serve tests check these exist.
RAY_SERIES_CPU: frozenset[str] = frozenset(
    {
        # Requests and errors per deployment, as Serve's own replicas count them.
        "ray_serve_deployment_request_counter_total",
        "ray_serve_deployment_processing_latency_ms_bucket",
        # Requests a replica is working on (Serve's autoscaling signal).
        "ray_serve_replica_processing_queries",
        # CPU and memory per Ray worker process; its Component label names the actor
        # class (ServeReplica:<app>:<deployment>), so this is "per replica".
        "ray_component_cpu_percentage",
        "ray_component_rss_mb",
        # The node as a whole.
        "ray_node_cpu_utilization",
        "ray_node_mem_used",
    }
)
# Exported only on nodes with GPUs (the dashboard's GPU panels stay empty elsewhere).
RAY_SERIES_GPU: frozenset[str] = frozenset(
    {
        "ray_node_gpus_utilization",
        "ray_node_gram_used",
    }
)
RAY_SERIES: frozenset[str] = RAY_SERIES_CPU | RAY_SERIES_GPU


class RayRecorder:
    """Creates each Ray metric on first use, inside the replica, so Serve's labels for
    that replica are attached."""

    def __init__(self) -> None:
        self._metrics: dict[str, Any] = {}

    def record(self, series: Series, value: float, labels: Mapping[str, str]) -> None:
        metric = self._metrics.get(series.name)
        if metric is None:
            metric = self._metrics[series.name] = _make(series)
        tags = dict(labels)
        if series.kind is Kind.COUNTER:
            if value > 0:  # Ray refuses a zero increment
                metric.inc(value, tags)
        elif series.kind is Kind.HISTOGRAM:
            metric.observe(value, tags)
        else:
            metric.set(value, tags)


def _make(series: Series) -> Any:
    # Ray annotates tag_keys as tuple[str] but takes any number of keys.
    labels: Any = series.labels
    if series.kind is Kind.COUNTER:
        return serve_metrics.Counter(series.name, series.description, labels)
    if series.kind is Kind.HISTOGRAM:
        return serve_metrics.Histogram(
            series.name, series.description, list(series.buckets), labels
        )
    return serve_metrics.Gauge(series.name, series.description, labels)


def build_metrics() -> TributaryMetrics:
    """Ray's metrics inside a Ray worker, gathered and handed on once a second
    (core/metrics/metric_buffer.py); outside one (tests with fake handles) the values go nowhere,
    since Ray's metric objects need a running Ray."""
    if ray.is_initialized():
        return TributaryMetrics(BufferedRecorder(RayRecorder()))
    return TributaryMetrics()
