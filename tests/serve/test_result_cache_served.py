"""The result cache in the real app with the real model: repeated texts hit, a hit's vector
is the fresh one bit for bit, and concurrent identical texts reach the replica once."""

from __future__ import annotations

import asyncio
import base64
import uuid

import httpx
import numpy as np

from tests.serve.conftest import AUTH, CACHED_MODEL, Server


def unique(label: str) -> str:
    # Texts no other test sends: the cache lives as long as the session's app.
    return f"{label} {uuid.uuid4().hex}"


def post(server: Server, texts: list[str]) -> dict:
    body = {"model": CACHED_MODEL, "input": texts, "encoding_format": "base64"}
    response = httpx.post(f"{server.url}/v1/embeddings", json=body, headers=AUTH, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def raw_vectors(body: dict) -> list[bytes]:
    return [base64.b64decode(entry["embedding"]) for entry in body["data"]]


def stats(server: Server) -> dict:
    model = httpx.get(f"{server.url}/v1/stats", headers=AUTH, timeout=30).json()["models"][
        CACHED_MODEL
    ]
    # A model's cache is made at its first lookup, and has no figures before it: the
    # first test of a session reads none.
    model.setdefault("cache", {"hits": 0, "deduplicated": 0})
    return model


def test_repeated_texts_hit_bitwise(server: Server) -> None:
    a, b, c = unique("the river"), unique("a tributary"), unique("the delta")
    before = stats(server)
    first = post(server, [a, b])
    second = post(server, [b, c, a])
    assert first["usage"]["cached_inputs"] == 0
    assert second["usage"]["cached_inputs"] == 2
    fresh, again = raw_vectors(first), raw_vectors(second)
    assert again[2] == fresh[0] and again[0] == fresh[1]  # float32, bit for bit
    vector = np.frombuffer(again[1], dtype=np.float32)
    assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-5
    after = stats(server)
    assert after["replica"]["items"] - before["replica"]["items"] == 3  # a, b, c once each
    assert after["cache"]["hits"] - before["cache"]["hits"] == 2


def test_concurrent_identical_texts_reach_the_replica_once(server: Server) -> None:
    shared = unique("shared by every request")
    own = [unique(f"own {i}") for i in range(8)]
    before = stats(server)

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(headers=AUTH, timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        f"{server.url}/v1/embeddings",
                        json={"model": CACHED_MODEL, "input": [shared, text, shared]},
                    )
                    for text in own
                )
            )

    responses = asyncio.run(run())
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    shared_vectors = {np.asarray(r.json()["data"][0]["embedding"]).tobytes() for r in responses}
    assert len(shared_vectors) == 1
    after = stats(server)
    # 24 inputs sent; the replica embedded the shared text once and each own text once.
    assert after["replica"]["items"] - before["replica"]["items"] == 1 + len(own)
    cache = after["cache"]
    saved = (cache["hits"] - before["cache"]["hits"]) + (
        cache["deduplicated"] - before["cache"]["deduplicated"]
    )
    assert saved >= len(own) - 1  # every later request waited for or hit the first's
