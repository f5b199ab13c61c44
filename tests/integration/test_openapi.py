"""GET /openapi.json of the real HTTP app: a valid OpenAPI document in which every `$ref`
resolves, every model route lists its request body and every status it can answer."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openapi_spec_validator import validate

from tests.integration.full_app import RERANK, FullApp

MODEL_ROUTES = [
    "/v1/embeddings",
    "/v1/embed",
    "/v2/embed",
    "/embed",
    "/",
    "/v1/rerank",
    "/v2/rerank",
    "/rerank",
    "/v1/chat/completions",
    "/v1/completions",
]
ERROR_STATUSES = {"400", "401", "403", "404", "413", "429", "500", "503", "504"}


def build_app(tenants: list[dict[str, Any]] | None = None) -> Any:
    return FullApp(tenants).app


async def fetch_document(app: Any) -> dict[str, Any]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        response = await client.get("/openapi.json")
    assert response.status_code == 200
    return response.json()


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        node = node[part]  # a KeyError is an unresolved $ref
    return node


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return asyncio.run(fetch_document(build_app()))


async def test_the_document_is_valid_openapi(document: dict[str, Any]) -> None:
    validate(document)  # raises on any violation of the OpenAPI 3.1 schema
    assert document["openapi"].startswith("3.1")


async def test_every_ref_resolves_inside_the_document(document: dict[str, Any]) -> None:
    found = set(refs(document))
    assert "#/components/schemas/ChatMessage" in found  # one that used to be #/$defs/...
    for ref in found:
        assert ref.startswith("#/components/schemas/"), ref
        resolve(document, ref)


async def test_every_model_route_has_its_body_and_every_status(document: dict[str, Any]) -> None:
    for path in MODEL_ROUTES:
        operation = document["paths"][path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        request = resolve(document, body["$ref"])
        assert request["type"] == "object" and request["additionalProperties"] is False
        responses = operation["responses"]
        assert set(responses) == {"200"} | ERROR_STATUSES, path
        for status in ERROR_STATUSES:
            error = responses[status]["content"]["application/json"]["schema"]
            assert error == {"$ref": "#/components/schemas/ErrorBody"}
        for status in ("429", "503"):
            assert "Retry-After" in responses[status]["headers"], (path, status)
        assert "WWW-Authenticate" in responses["401"]["headers"]
        headers = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
        assert headers == {"X-Priority", "X-Request-Timeout", "X-Request-ID"}


async def test_limits_and_bounds_are_in_the_document(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    embeddings = document["paths"]["/v1/embeddings"]["post"]["responses"]["413"]
    described = embeddings["description"]
    assert f"{1 << 20} bytes" in described and "fake-embedder: 10" in described
    rerank = document["paths"]["/v2/rerank"]["post"]["responses"]["413"]
    assert f"{RERANK}: 5" in rerank["description"]
    seed = schemas["ChatCompletionRequest"]["properties"]["seed"]["anyOf"][0]
    assert seed == {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}
    max_tokens = schemas["CompletionRequest"]["properties"]["max_tokens"]["anyOf"][0]
    assert max_tokens["minimum"] == 1 and max_tokens["maximum"] == 2**31 - 1
    top_p = schemas["CompletionRequest"]["properties"]["top_p"]
    assert top_p["exclusiveMinimum"] == 0 and top_p["maximum"] == 1
    prompt = schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"][0]
    assert prompt == {"type": "string", "minLength": 1}
    assert schemas["RerankRequest"]["properties"]["documents"]["minItems"] == 1
    timeout = document["paths"]["/rerank"]["post"]["parameters"][1]["schema"]
    assert timeout["exclusiveMinimum"] == 0 and timeout["maximum"] == 3600


async def test_keys_required_shows_as_bearer_security_on_model_routes() -> None:
    tenant = {"name": "t", "key_sha256": ["0" * 64]}
    document = await fetch_document(build_app([tenant]))
    validate(document)
    scheme = document["components"]["securitySchemes"]["apiKey"]
    assert scheme == {"type": "http", "scheme": "bearer", "description": "An API key."}
    for path in MODEL_ROUTES:
        assert document["paths"][path]["post"]["security"] == [{"apiKey": []}]
    assert "security" not in document["paths"]["/healthz"]["get"]


async def test_health_and_models_document_head(document: dict[str, Any]) -> None:
    for path in ("/healthz", "/v1/models"):
        assert set(document["paths"][path]) == {"get", "head"}
