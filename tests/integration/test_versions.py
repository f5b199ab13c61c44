"""Model versions at the ingress, with fake handles: the split, pinning, the header, a
policy changed at runtime, a version in an application of its own, shadow copies and the
canary guard."""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest

from deployments.core.metrics.metrics import SHADOW_AGREEMENT, MemoryRecorder, TributaryMetrics
from deployments.core.protocol import EmbedJob, EmbedResult
from deployments.http.server import HttpIngress as Ingress
from tests.integration.conftest import CONFIG, FakeEmbedder, _Method

MODEL = "fake-embedder"


class ShiftedEmbedder(FakeEmbedder):
    """A second checkpoint: the same vectors, nudged, so agreement is high but not 1."""

    def _result(self, job: EmbedJob) -> EmbedResult:
        result = super()._result(job)
        nudged = result.vectors + 0.05
        nudged /= np.linalg.norm(nudged, axis=1, keepdims=True)
        return EmbedResult(nudged.astype(np.float32), result.token_counts, result.truncated)


class VersionApp:
    """`serve.get_app_handle(app)` of a version served by its own application."""

    def __init__(self, embedder: FakeEmbedder, config: dict[str, Any]) -> None:
        self.embedder = embedder
        self.remote = embedder.remote
        self.forget = embedder.forget
        self.info = embedder.info

        async def describe() -> dict[str, Any]:
            return {"task": "embedding", "config": config}

        self.model_config = _Method(describe)


class Versions:
    def __init__(self, cache: bool = False) -> None:
        self.v1, self.v2, self.v3 = FakeEmbedder(), ShiftedEmbedder(), ShiftedEmbedder()
        config = copy.deepcopy(CONFIG)
        if cache:
            config["cache"] = {"enabled": True}
        base = config["embedding_models"][0]
        config["embedding_models"].append({**base, "version": "2"})
        self.recorder = MemoryRecorder()
        v3_config = {**base, "version": "3"}
        self.ingress = Ingress(
            config,
            embedders={f"{MODEL}@1": self.v1, f"{MODEL}@2": self.v2},
            readiness=_ready,
            metrics=TributaryMetrics(self.recorder),
            app_handle=lambda app: VersionApp(self.v3, v3_config) if app == "v3-app" else None,
        )
        self.app = self.ingress.__serve_build_asgi_app__()


async def _ready() -> str | None:
    return None


@pytest.fixture
async def versions() -> AsyncIterator[tuple[Versions, httpx.AsyncClient]]:
    setup = Versions()
    transport = httpx.ASGITransport(app=setup.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        yield setup, client
    await setup.ingress.catalog.close()


def embed(text: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": text, **extra}


async def test_without_a_policy_the_first_version_serves_and_says_so(versions: Any) -> None:
    setup, client = versions
    response = await client.post("/v1/embeddings", json=embed("hello"))
    assert response.status_code == 200
    assert response.headers["x-model-version"] == "1"
    assert len(setup.v1.calls) == 1 and not setup.v2.calls
    listed = (await client.get("/v1/models")).json()["data"]
    assert [m["id"] for m in listed] == [MODEL]
    assert [v["version"] for v in listed[0]["versions"]] == ["1", "2"]


async def test_a_pin_by_header_or_name_reaches_that_version(versions: Any) -> None:
    setup, client = versions
    by_name = await client.post("/v1/embeddings", json=embed("a", model=f"{MODEL}@2"))
    by_header = await client.post(
        "/v1/embeddings", json=embed("b"), headers={"X-Model-Version": "2"}
    )
    assert by_name.headers["x-model-version"] == by_header.headers["x-model-version"] == "2"
    assert by_name.json()["model"] == f"{MODEL}@2"  # echoed as asked, like OpenAI does
    assert len(setup.v2.calls) == 2
    unknown = await client.post("/v1/embeddings", json=embed("c", model=f"{MODEL}@9"))
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_version_not_found"
    clash = await client.post(
        "/v1/embeddings", json=embed("d", model=f"{MODEL}@1"), headers={"X-Model-Version": "2"}
    )
    assert clash.status_code == 400


async def test_weights_split_traffic_and_sessions_stick(versions: Any) -> None:
    setup, client = versions
    await setup.ingress.reconfigure({"models": {MODEL: {"weights": {"1": 70, "2": 30}}}})
    seen: Counter[str] = Counter()
    for i in range(600):
        response = await client.post("/v1/embeddings", json=embed(f"t{i}"))
        seen[response.headers["x-model-version"]] += 1
    # Unkeyed callers are drawn at random (unseeded): 600 draws at 30 % spread with a
    # standard deviation of 1.9 points. +-7 points failed about 1 run in 5,000; +-10
    # (5.3 deviations) fails about 1 in 8 million and still tells 70/30 from 50/50.
    assert abs(seen["2"] / 600 - 0.30) < 0.10
    session = {"X-Session-ID": "abc"}
    answers = {
        (await client.post("/v1/embeddings", json=embed(f"s{i}"), headers=session)).headers[
            "x-model-version"
        ]
        for i in range(30)
    }
    assert len(answers) == 1


async def test_a_bad_policy_keeps_the_last_good_one(versions: Any) -> None:
    setup, client = versions
    await setup.ingress.reconfigure({"models": {MODEL: {"weights": {"2": 1}}}})
    await setup.ingress.reconfigure({"models": {MODEL: {"weights": {"7": 1}}}})
    stats = (await client.get("/v1/stats")).json()
    assert "unknown version" in stats["traffic_error"]
    response = await client.post("/v1/embeddings", json=embed("x"))
    assert response.headers["x-model-version"] == "2"


async def test_a_version_in_its_own_application_is_reached_then_takes_traffic(
    versions: Any,
) -> None:
    setup, client = versions
    policy = {"versions": {"3": {"app": "v3-app"}}, "weights": {"1": 0, "3": 1}}
    await setup.ingress.reconfigure({"models": {MODEL: policy}})
    for _ in range(50):
        if setup.ingress.catalog.table(MODEL).versions["3"].ready:
            break
        await asyncio.sleep(0.01)
    response = await client.post("/v1/embeddings", json=embed("to three"))
    assert response.headers["x-model-version"] == "3"
    assert len(setup.v3.calls) == 1
    # Dropped from the policy: gone from the model, and traffic returns to the first.
    await setup.ingress.reconfigure({"models": {MODEL: {"weights": {"1": 1}}}})
    assert "3" not in setup.ingress.catalog.table(MODEL).versions
    response = await client.post("/v1/embeddings", json=embed("back"))
    assert response.headers["x-model-version"] == "1"


async def test_a_model_whose_only_version_is_still_starting_gets_503_not_404(
    versions: Any,
) -> None:
    setup, client = versions
    policy = {"versions": {"1": {"app": "not-there-yet"}}}
    await setup.ingress.reconfigure({"models": {"new-model": policy}})
    response = await client.post("/v1/embeddings", json={"model": "new-model", "input": "x"})
    assert response.status_code == 503 and response.headers["retry-after"]
    assert "new-model" not in [m["id"] for m in (await client.get("/v1/models")).json()["data"]]


async def test_shadow_copies_are_compared_and_never_answer(versions: Any) -> None:
    setup, client = versions
    policy = {"weights": {"1": 1}, "shadow": {"version": "2", "fraction": 1.0}}
    await setup.ingress.reconfigure({"models": {MODEL: policy}})
    for i in range(10):
        response = await client.post("/v1/embeddings", json=embed(f"shadowed {i}"))
        assert response.headers["x-model-version"] == "1"
    for _ in range(100):
        if len(setup.recorder.values(SHADOW_AGREEMENT)) == 10:
            break
        await asyncio.sleep(0.01)
    cosines = setup.recorder.values(SHADOW_AGREEMENT, measure="cosine")
    assert len(cosines) == 10 and all(0.9 < c < 1.0 for c in cosines)
    assert set(setup.v2.priorities) == {"batch"}
    shadow = (await client.get("/v1/stats")).json()["models"][MODEL]["shadow"]["2"]
    assert shadow["compared"] == 10 and 0.9 < shadow["mean_agreement"]["cosine"] < 1


async def test_a_failing_canary_is_stopped_until_rearmed(versions: Any) -> None:
    setup, client = versions
    guard = {"min_requests": 5, "max_error_rate_increase": 0.1}
    policy = {"weights": {"1": 50, "2": 50}, "sticky_by": [], "guard": guard}
    await setup.ingress.reconfigure({"models": {MODEL: policy}})
    setup.v2.fail = RuntimeError("canary broke")
    statuses = [
        (await client.post("/v1/embeddings", json=embed(f"g{i}"))).status_code for i in range(60)
    ]
    assert 500 in statuses or 503 in statuses
    table = setup.ingress.catalog.table(MODEL)
    assert "2" in table.guard.tripped
    after = [(await client.post("/v1/embeddings", json=embed(f"h{i}"))) for i in range(20)]
    assert {r.headers["x-model-version"] for r in after} == {"1"}
    await setup.ingress.reconfigure({"models": {MODEL: policy}})  # the same: still stopped
    assert "2" in setup.ingress.catalog.table(MODEL).guard.tripped
    rearmed = {**policy, "guard": {**guard, "rearm": 1}}
    await setup.ingress.reconfigure({"models": {MODEL: rearmed}})
    assert setup.ingress.catalog.table(MODEL).guard.tripped == {}


async def test_the_result_cache_never_hands_one_version_the_others_vector() -> None:
    setup = Versions(cache=True)
    transport = httpx.ASGITransport(app=setup.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        first = await client.post("/v1/embeddings", json=embed("same text"))
        again = await client.post("/v1/embeddings", json=embed("same text"))
        other = await client.post("/v1/embeddings", json=embed("same text", model=f"{MODEL}@2"))
    assert first.json()["usage"]["cached_inputs"] == 0
    assert again.json()["usage"]["cached_inputs"] == 1 and len(setup.v1.calls) == 1
    assert other.headers["x-model-version"] == "2"
    assert other.json()["usage"]["cached_inputs"] == 0 and len(setup.v2.calls) == 1
    assert other.json()["data"][0]["embedding"] != first.json()["data"][0]["embedding"]
