"""Generation models with two versions at the ingress (fake streaming handles): the
version header, pinning, and greedy shadow copies compared by exact match."""

from __future__ import annotations

import asyncio

from deployments.core.metrics.metrics import SHADOW_AGREEMENT, MemoryRecorder, TributaryMetrics
from deployments.core.protocol import GenerationChunk
from deployments.http.server import HttpIngress as Ingress
from tests.integration.conftest import CONFIG, FakeEmbedder
from tests.integration.test_generation_route import MODEL, FakeGenerator, client_of


async def _ready() -> None:
    return None


def two_versions() -> tuple[Ingress, FakeGenerator, FakeGenerator, MemoryRecorder]:
    models = [
        {"name": MODEL, "source": "demo:tiny-llama"},
        {"name": MODEL, "source": "demo:tiny-llama", "version": "2"},
    ]
    v1, v2 = FakeGenerator(), FakeGenerator()
    v2.events = [GenerationChunk("hello", 3, 1), GenerationChunk(" there", 3, 2, "length")]
    recorder = MemoryRecorder()
    ingress = Ingress(
        {**CONFIG, "generation_models": models},
        embedders={"fake-embedder": FakeEmbedder()},
        generators={f"{MODEL}@1": v1, f"{MODEL}@2": v2},
        readiness=_ready,
        metrics=TributaryMetrics(recorder),
    )
    return ingress, v1, v2, recorder


async def test_generation_answers_name_their_version_and_pins_work() -> None:
    ingress, v1, v2, _ = two_versions()
    async with client_of(ingress.__serve_build_asgi_app__()) as client:
        plain = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
        pinned = await client.post(
            "/v1/completions", json={"model": f"{MODEL}@2", "prompt": "hi", "stream": True}
        )
    assert plain.headers["x-model-version"] == "1" and len(v1.calls) == 1
    assert pinned.headers["x-model-version"] == "2" and len(v2.calls) == 1
    assert "there" in pinned.text


async def test_greedy_shadow_copies_are_compared_by_exact_match() -> None:
    ingress, _, v2, recorder = two_versions()
    policy = {"weights": {"1": 1}, "shadow": {"version": "2", "fraction": 1.0}}
    await ingress.reconfigure({"models": {MODEL: policy}})
    async with client_of(ingress.__serve_build_asgi_app__()) as client:
        for temperature in (0, 0, 0.7):
            body = {"model": MODEL, "prompt": "hi", "temperature": temperature}
            response = await client.post("/v1/completions", json=body)
            assert response.json()["choices"][0]["text"] == "hello world"
    for _ in range(100):
        if len(v2.calls) == 3:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    assert [call[0] for call in v2.calls] == ["batch"] * 3  # copies ride at the batch class
    # Only the greedy requests are compared; "hello there" is not "hello world".
    assert recorder.values(SHADOW_AGREEMENT, measure="exact_match") == [0.0, 0.0]
