"""Ray's Prometheus endpoint of the real server: after real traffic, Tributary's series
are there with the right labels, next to Ray's and Serve's.

Ray's agent exports what the replicas recorded every few seconds, so the checks poll
the endpoint with a bounded timeout rather than reading it once.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx
import pytest

from deployments.core.metrics.metrics import SERIES
from deployments.metrics import RAY_SERIES_CPU
from tests.serve.conftest import (
    AUTH,
    LIMITED_KEY,
    MODEL,
    RERANK_MODEL,
    STRICT_MODEL,
    Server,
)

LLM = "tiny-llama-demo"  # the default app's demo generation model

Sample = tuple[str, dict[str, str], float]
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
EXPORT_TIMEOUT_S = 60


def scrape(server: Server) -> list[Sample]:
    """Every sample line of the endpoint as (name, labels, value)."""
    samples: list[Sample] = []
    for line in httpx.get(server.metrics_url, timeout=10).text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        samples.append((name, dict(LABEL.findall(labels)), float(value)))
    return samples


def total(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(
        value
        for n, got, value in samples
        if n == name and all(got.get(k) == v for k, v in labels.items())
    )


def wait_for(server: Server, ready: Callable[[list[Sample]], bool]) -> list[Sample]:
    deadline = time.monotonic() + EXPORT_TIMEOUT_S
    while True:
        samples = scrape(server)
        if ready(samples) or time.monotonic() > deadline:
            return samples
        time.sleep(2)


def embed(server: Server, priority: str, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/embeddings",
        json={"model": MODEL, "input": ["metrics check one", "and two"]},
        headers={**AUTH, "X-Priority": priority, **headers},
        timeout=60,
    )


@pytest.fixture(scope="module")
def traffic(server: Server) -> dict[str, int]:
    """Answered requests in every class, a rerank, a deadline miss and a rate limit."""
    sent = {}
    for priority in ("realtime", "normal", "batch"):
        responses = [embed(server, priority) for _ in range(4)]
        assert [r.status_code for r in responses] == [200] * 4
        sent[priority] = 4
    rerank = httpx.post(
        f"{server.url}/v2/rerank",
        json={"model": RERANK_MODEL, "query": "capital of France", "documents": ["Paris", "Rome"]},
        headers=AUTH,
        timeout=60,
    )
    assert rerank.status_code == 200
    late = embed(server, "normal", **{"X-Request-Timeout": "0.001"})
    assert late.status_code == 504
    limited = {**AUTH, "Authorization": f"Bearer {LIMITED_KEY}"}
    statuses = [embed(server, "normal", **limited).status_code for _ in range(6)]
    assert 429 in statuses  # 1 request/s with a burst of 2
    return sent


def test_requests_are_counted_by_model_version_class_and_status(
    server: Server, traffic: dict[str, int]
) -> None:
    name = "ray_tributary_requests_total"
    ok = {"model": MODEL, "model_version": "1", "status": "200", "deployment": "ingress"}

    latency = "ray_tributary_request_latency_seconds_count"

    def counted(samples: list[Sample]) -> bool:
        return (
            all(total(samples, name, **ok, priority=p) >= n for p, n in traffic.items())
            and total(samples, name, model=RERANK_MODEL, status="200") >= 1
            and total(samples, name, model=MODEL, status="504") >= 1
            and total(samples, latency, model=MODEL, priority="batch") >= traffic["batch"]
        )

    samples = wait_for(server, counted)
    for priority, sent in traffic.items():
        assert total(samples, name, **ok, priority=priority) >= sent, priority
    assert total(samples, name, model=RERANK_MODEL, status="200") >= 1
    assert total(samples, name, model=MODEL, status="504") >= 1
    assert total(samples, latency, model=MODEL, priority="batch") >= traffic["batch"]


def test_rejections_are_counted_by_reason(server: Server, traffic: dict[str, int]) -> None:
    name = "ray_tributary_rejections_total"
    reasons = ("deadline", "rate_limit")

    samples = wait_for(
        server, lambda s: all(total(s, name, model=MODEL, reason=r) >= 1 for r in reasons)
    )
    assert total(samples, name, model=MODEL, priority="normal", reason="deadline") >= 1
    assert total(samples, name, model=MODEL, priority="normal", reason="rate_limit") >= 1


def test_batches_queue_waits_and_queue_depth_per_model_and_class(
    server: Server, traffic: dict[str, int]
) -> None:
    replica = {"deployment": f"embed-{MODEL}", "model": MODEL}
    histograms = [
        f"ray_tributary_{h}_count"
        for h in ("batch_size", "batch_tokens", "inference_seconds", "queue_wait_seconds")
    ]

    def items(samples: list[Sample]) -> float:
        return total(samples, "ray_tributary_batch_items_total", **replica, priority="realtime")

    rerank = {"deployment": f"rerank-{RERANK_MODEL}", "model": RERANK_MODEL}

    def recorded(samples: list[Sample]) -> bool:
        # Batches of 2-text requests: they computed at least the inputs sent. Every
        # replica hands its values on by itself (core/metrics/metric_buffer.py): wait for each.
        busy = total(samples, "ray_tributary_model_busy_seconds_total", **replica)
        return (
            busy > 0
            and total(samples, "ray_tributary_batch_size_count", **rerank) > 0
            and items(samples) >= 2 * traffic["realtime"]
            and all(
                total(samples, h, **replica, priority=p) > 0 for h in histograms for p in traffic
            )
        )

    samples = wait_for(server, recorded)
    for histogram in histograms:
        for priority in traffic:
            assert total(samples, histogram, **replica, priority=priority) > 0, histogram
    assert items(samples) >= 2 * traffic["realtime"]
    busy = total(samples, "ray_tributary_model_busy_seconds_total", **replica)
    assert 0 < busy < 600  # seconds of forward passes since the server started
    assert total(samples, "ray_tributary_batch_size_count", **rerank) > 0
    depth = {
        (labels["model"], labels["priority"])
        for n, labels, _ in samples
        if n.endswith("tributary_queue_depth")
    }
    assert {(MODEL, p) for p in traffic} <= depth


def test_ray_and_serve_series_the_dashboard_uses_are_exported(
    server: Server, traffic: dict[str, int]
) -> None:
    samples = wait_for(server, lambda s: {n for n, _, _ in s} >= RAY_SERIES_CPU)
    names = {n for n, _, _ in samples}
    assert sorted(RAY_SERIES_CPU - names) == []
    # Every Tributary series recorded so far came out under the name core.metrics
    # derives (the cache series has no recorder yet: there is no cache).
    ours = {n for n in names if n.startswith("ray_tributary_")}
    declared = set().union(*(s.exported_names() for s in SERIES))
    assert ours and ours <= declared


def test_device_memory_and_the_token_ceiling_are_exported(
    server: Server, traffic: dict[str, int]
) -> None:
    memory = "ray_tributary_device_memory_bytes"
    ceiling = "ray_tributary_token_ceiling"

    def ready(samples: list[Sample]) -> bool:
        return (
            total(samples, memory, model=MODEL, kind="process") > 0
            and total(samples, ceiling, model=STRICT_MODEL) > 0
        )

    samples = wait_for(server, ready)
    for kind in ("total", "free", "process"):
        assert total(samples, memory, model=MODEL, kind=kind) > 0, kind
    # The strict copy has memory_budget_mib (its warm-up probe); MODEL has none.
    assert 256 <= total(samples, ceiling, model=STRICT_MODEL) < 16384
    assert total(samples, ceiling, model=MODEL) == 0
    # No GPU here: no utilisation is exported rather than a made-up one.
    assert not [n for n, _, _ in samples if n == "ray_tributary_device_utilization_percent"]


def test_generation_records_token_timings_sequences_and_output_tokens(server: Server) -> None:
    completion = httpx.post(
        f"{server.url}/v1/completions",
        json={"model": LLM, "prompt": "metrics for tokens", "max_tokens": 6, "temperature": 0},
        headers={**AUTH, "X-Priority": "realtime"},
        timeout=60,
    )
    assert completion.status_code == 200
    tokens = completion.json()["usage"]["completion_tokens"]
    replica = {"deployment": f"generate-{LLM}", "model": LLM}

    first = "ray_tributary_time_to_first_token_seconds_count"
    requests = {"model": LLM, "status": "200", "priority": "realtime", "deployment": "ingress"}

    def recorded(samples: list[Sample]) -> bool:
        # Earlier tests' completions already count in the other series; only this one
        # is realtime, so its realtime counts say that this request was exported, by
        # the replica and (separately, on its own schedule) by the ingress.
        return (
            total(samples, first, **replica, priority="realtime") >= 1
            and total(samples, "ray_tributary_requests_total", **requests) >= 1
            and total(samples, "ray_tributary_output_tokens_total", **replica) >= tokens
            and total(samples, "ray_tributary_inter_token_latency_seconds_count", **replica) > 0
        )

    samples = wait_for(server, recorded)
    assert total(samples, first, **replica, priority="realtime") >= 1
    assert total(samples, "ray_tributary_output_tokens_total", **replica) >= tokens
    assert total(samples, "ray_tributary_inter_token_latency_seconds_count", **replica) > 0
    names = {n for n, labels, _ in samples if labels.get("model") == LLM}
    assert {"ray_tributary_running_sequences", "ray_tributary_waiting_sequences"} <= names
    assert total(samples, "ray_tributary_requests_total", **requests) >= 1
