"""What the ingress records per request: the series Prometheus gets (through a memory
recorder standing in for Ray's) and the per-class figures of /v1/stats and /status."""

from __future__ import annotations

import asyncio

import httpx

from deployments.core.metrics.metrics import QUEUE_DEPTH, REJECTIONS, REQUEST_LATENCY, REQUESTS
from tests.integration.conftest import Harness
from tests.integration.test_priorities import MODEL, post, settle


async def test_a_request_is_counted_with_its_model_version_class_and_status(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    assert (await post(client, 3, "realtime")).status_code == 200
    assert (await post(client, 1, "urgent")).status_code == 400  # bad X-Priority header
    # Too many inputs: found only once the model is known (an empty input is refused by the
    # schema, before the body names a model the ingress has looked up).
    bad = await client.post("/v1/embeddings", json={"model": MODEL, "input": ["a"] * 11})
    assert bad.status_code == 413
    unknown = await client.post("/v1/embeddings", json={"model": "nope", "input": "a"})
    assert unknown.status_code == 404
    recorder = harness.recorder
    ok = {"model": MODEL, "model_version": "1", "priority": "realtime", "status": "200"}
    assert recorder.values(REQUESTS, **ok) == [1]
    # A bad header fails before the route's method runs: not an API request yet.
    # Bad input for a known model keeps its model; an unknown name is never a label.
    assert recorder.values(REQUESTS, model=MODEL, priority="unknown", status="413") == [1]
    assert recorder.values(REQUESTS, model="unknown", status="404") == [1]
    (latency,) = recorder.values(REQUEST_LATENCY, model=MODEL, priority="realtime")
    assert 0 < latency < 5
    assert recorder.values(REJECTIONS) == []


async def test_shedding_a_deadline_and_a_full_queue_are_rejections_by_reason(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    harness.embedder.gate.clear()
    held = [asyncio.create_task(post(client, 1, p)) for p in ("normal", "realtime")]
    await settle()
    queued = [asyncio.create_task(post(client, 10, "normal")) for _ in range(2)]
    await settle()  # 20 normal inputs queued: batch is shed above 20
    assert (await post(client, 1, "batch")).status_code == 429
    late = await post(client, "late", **{"X-Request-Timeout": "0.05"})
    assert late.status_code == 504
    assert harness.recorder.values(QUEUE_DEPTH, model=MODEL, priority="normal")[-1] == 20
    harness.embedder.gate.set()
    await asyncio.gather(*held, *queued)
    recorder = harness.recorder
    assert recorder.values(REJECTIONS, model=MODEL, priority="batch", reason="shed") == [1]
    assert recorder.values(REJECTIONS, model=MODEL, priority="normal", reason="deadline") == [1]
    assert recorder.values(REQUESTS, priority="batch", status="429") == [1]
    # Once the queue drained, the gauge says so.
    assert recorder.values(QUEUE_DEPTH, model=MODEL, priority="normal")[-1] == 0


async def test_a_client_that_leaves_is_a_client_gone_rejection(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    harness.embedder.gate.clear()
    leaving = asyncio.create_task(post(client, "bye"))
    await settle()
    leaving.cancel()
    await settle()
    harness.embedder.gate.set()
    gone = harness.recorder.values(REJECTIONS, model=MODEL, reason="client_gone")
    assert gone == [1]
    assert harness.recorder.values(REQUESTS, model=MODEL, status="499") == [1]


async def test_stats_summarise_each_class_for_the_status_page(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    for _ in range(4):
        assert (await post(client, 2, "batch")).status_code == 200
    harness.embedder.reject = None
    classes = (await client.get("/v1/stats")).json()["models"][MODEL]["classes"]
    batch = classes["batch"]
    assert batch["requests"] == 4 and batch["errors"] == 0
    assert batch["items_per_s"] > 0 and batch["requests_per_s"] > 0
    assert 0 < batch["p50_ms"] <= batch["p99_ms"]
    assert batch["queued_items"] == 0
    assert classes["realtime"]["requests"] == 0 and classes["realtime"]["p50_ms"] is None


async def test_the_status_page_is_self_contained_html_reading_v1_stats(
    client: httpx.AsyncClient,
) -> None:
    page = await client.get("/status")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    assert 'fetch("v1/stats"' in html and "setInterval(refresh, 2000)" in html
    # Nothing from another origin: it must work where there is no internet.
    assert "http://" not in html and "https://" not in html
