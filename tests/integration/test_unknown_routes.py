"""An unknown route (issue 17) is a 404 in the error shape whose message names the request and
lists every route there is, so a client of another dialect sees what to call instead."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.test_embeddings_route import assert_error


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v3/embed"),  # a Cohere API version that does not exist
        ("GET", "/no/such/path"),
        ("POST", "/v1/embeddings/extra"),
        ("DELETE", "/nope"),
    ],
)
async def test_an_unknown_route_is_a_404_listing_the_routes(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await client.request(method, path, json={})
    error = assert_error(response, 404)
    assert error["code"] == "not_found" and error["type"] == "invalid_request_error"
    message = error["message"]
    assert message.startswith(f"No route {method} {path}. The routes are: ")
    for route in ("POST /v1/embeddings", "POST /v2/rerank", "GET /healthz", "GET /docs"):
        assert route in message
    # The documentation assets stay out; the API's own templated paths (/v1/files/{file_id}) are in.
    assert "HEAD " not in message and "{name}" not in message


async def test_the_list_covers_every_documented_operation(client: httpx.AsyncClient) -> None:
    message = (await client.get("/missing")).json()["error"]["message"]
    paths = (await client.get("/openapi.json")).json()["paths"]
    for path, operations in paths.items():
        for method in operations:
            if method != "head":
                assert f"{method.upper()} {path}" in message


async def test_a_long_unknown_path_is_cut_in_the_message(client: httpx.AsyncClient) -> None:
    response = await client.get("/" + "x" * 5000)
    message = response.json()["error"]["message"]
    assert response.status_code == 404 and len(message) < 1500 and "x..." in message


async def test_a_known_route_with_a_wrong_method_stays_a_405(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/embeddings")
    assert_error(response, 405)
