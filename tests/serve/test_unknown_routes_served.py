"""Unknown paths through the whole stack (HAProxy front door, Serve, the ingress): the app is
mounted at `/`, so every path reaches the ingress, whose 404 is in the error shape and lists
the routes (issue 17). Serve's own plain-text 404 (HAProxy's `default_backend`) answers only
paths outside every application's route prefix, which `/` leaves none of."""

from __future__ import annotations

import httpx
import pytest

from tests.serve.conftest import AUTH, Server


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/v1/embedz"), ("GET", "/nope"), ("GET", "/-/nope")]
)
def test_an_unknown_path_gets_the_json_404_listing_routes(
    server: Server, method: str, path: str
) -> None:
    response = httpx.request(method, f"{server.url}{path}", json={}, headers=AUTH, timeout=30)
    assert response.status_code == 404, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == "not_found"
    assert f"No route {method} {path}." in error["message"]
    assert "POST /v1/embeddings" in error["message"]
