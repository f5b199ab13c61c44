import asyncio
import time
from typing import Any

import httpx

from deployments.http.server import HttpIngress as Ingress
from tests.integration.conftest import CONFIG, FakeEmbedder, Harness


async def test_models_lists_each_model_with_its_task(client: httpx.AsyncClient) -> None:
    body = (await client.get("/v1/models")).json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert card["id"] == "fake-embedder" and card["object"] == "model"
    assert card["task"] == "embedding" and isinstance(card["created"], int)


async def test_healthz_follows_readiness(client: httpx.AsyncClient, harness: Harness) -> None:
    assert (await client.get("/healthz")).status_code == 200
    harness.problem = "Deployment tributary/embed is UPDATING."
    response = await client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "Deployment tributary/embed is UPDATING."


async def test_unknown_routes_and_methods_answer_in_the_error_shape(
    client: httpx.AsyncClient,
) -> None:
    missing = await client.get("/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong_method = await client.get("/v1/embeddings")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"


async def test_stats_report_coalescing_and_replica_counters(
    client: httpx.AsyncClient,
) -> None:
    await client.post("/v1/embeddings", json={"model": "fake-embedder", "input": "a"})
    stats = (await client.get("/v1/stats")).json()["models"]["fake-embedder"]
    normal = stats["ingress"]["classes"]["normal"]
    assert normal["calls"] == 1 and normal["jobs"] == 1 and normal["queued_items"] == 0
    assert stats["ingress"]["classes"]["realtime"]["calls"] == 0
    assert stats["replica"]["batches"] == 1


async def test_openapi_documents_the_request_schema(client: httpx.AsyncClient) -> None:
    spec = (await client.get("/openapi.json")).json()
    body = spec["paths"]["/v1/embeddings"]["post"]["requestBody"]
    ref = body["content"]["application/json"]["schema"]["$ref"]
    schema = spec["components"]["schemas"][ref.removeprefix("#/components/schemas/")]
    assert {"model", "input"} <= set(schema["required"])


async def test_head_on_health_and_models_answers_like_get_without_a_body(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    for path in ("/healthz", "/v1/models"):
        response = await client.head(path)
        assert response.status_code == 200, path
        assert response.content == b""
    harness.problem = "Deployment tributary/embed is UPDATING."
    response = await client.head("/healthz")
    assert response.status_code == 503 and response.content == b""
    assert (await client.get("/healthz")).status_code == 503


class _EngineProbe:
    """A generation handle's `engine_alive.remote()`: says `alive`, or hangs, or fails."""

    def __init__(self) -> None:
        self.alive: bool = True
        self.hang = False
        self.fail: Exception | None = None
        self.engine_alive = self

    def remote(self, *_: Any) -> Any:
        return asyncio.ensure_future(self._answer())

    async def _answer(self) -> bool:
        if self.hang:
            await asyncio.sleep(30)
        if self.fail is not None:
            raise self.fail
        return self.alive


def _with_generator() -> tuple[httpx.AsyncClient, _EngineProbe]:
    config = {**CONFIG, "generation_models": [{"name": "gen-a", "source": "demo:tiny-llama"}]}
    probe = _EngineProbe()

    async def ready() -> None:
        return None

    ingress = Ingress(
        config,
        embedders={"fake-embedder": FakeEmbedder()},
        readiness=ready,
        generators={"gen-a": probe},
    )
    transport = httpx.ASGITransport(app=ingress.__serve_build_asgi_app__())
    return httpx.AsyncClient(transport=transport, base_url="http://ingress"), probe


async def test_healthz_is_503_naming_the_model_while_its_engine_is_down() -> None:
    client, probe = _with_generator()
    async with client:
        assert (await client.get("/healthz")).status_code == 200
        probe.alive = False
        began = time.monotonic()
        down = await client.get("/healthz")
        assert time.monotonic() - began < 2
        assert down.status_code == 503
        assert "'gen-a'" in down.json()["error"]["message"]
        probe.alive, probe.fail = True, RuntimeError("replica gone")
        assert (await client.get("/healthz")).status_code == 503
        probe.fail = None
        assert (await client.get("/healthz")).status_code == 200


async def test_healthz_does_not_wait_on_a_replica_too_busy_to_answer() -> None:
    client, probe = _with_generator()
    probe.hang = True
    async with client:
        began = time.monotonic()
        response = await client.get("/healthz")
    # Not reported down (Serve's own health check covers a replica that stopped), and
    # answered within the probe's timeout.
    assert response.status_code == 200 and time.monotonic() - began < 2
