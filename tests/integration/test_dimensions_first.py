"""A `dimensions` wider than the model's vectors is refused before admission: its 400 comes
with no call to the model and no tokens taken from the tenant, in every embed dialect."""

from __future__ import annotations

import copy

import httpx

from deployments.core.access.access import estimate_tokens
from deployments.core.access.keys import digest
from tests.integration.conftest import CONFIG, DIM, Harness
from tests.integration.test_embeddings_route import assert_error

MODEL = "fake-embedder"
KEY = "trib-metered-key-for-tests"
TEXT = "a text of forty characters, give or take"
AUTH = {"Authorization": f"Bearer {KEY}"}

# Each dialect's way of asking for more components than the model has, and its param.
TOO_WIDE = [
    ("/v1/embeddings", {"model": MODEL, "input": TEXT, "dimensions": DIM + 1}, "dimensions"),
    (
        "/v2/embed",
        {"model": MODEL, "texts": [TEXT], "output_dimension": DIM * 2},
        "output_dimension",
    ),
    ("/embed", {"inputs": TEXT, "dimensions": DIM + 1}, "dimensions"),
    ("/embed", {"inputs": TEXT, "dimensions": DIM + 1, "normalize": False}, "dimensions"),
]


def metered_harness() -> Harness:
    config = copy.deepcopy(CONFIG)
    # A budget of exactly one request's estimate, refilled too slowly to matter: a request
    # that took any of it would leave too little for the valid one at the end.
    config["auth"] = {
        "tenants": [
            {
                "name": "metered",
                "key_sha256": [digest(KEY)],
                "tokens_per_s": 0.001,
                "burst_tokens": estimate_tokens([TEXT]),
            }
        ]
    }
    return Harness(config)


async def test_too_wide_is_a_400_with_no_model_call_and_no_charge() -> None:
    harness = metered_harness()
    transport = httpx.ASGITransport(app=harness.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        for path, body, param in TOO_WIDE * 2:
            response = await client.post(path, json=body, headers=AUTH)
            error = assert_error(response, 400, param)
            assert error["message"].endswith(f"has {DIM}."), error
        assert harness.embedder.calls == []  # no forward pass
        assert harness.embedder.info_calls == 1  # the width, asked once
        # The whole budget is still there: the one valid request may spend it all.
        fits = {"model": MODEL, "input": TEXT, "dimensions": DIM}
        assert (await client.post("/v1/embeddings", json=fits, headers=AUTH)).status_code == 200
    assert len(harness.embedder.calls) == 1


class _Unreachable:
    def remote(self) -> None:
        raise RuntimeError("the replica cannot be asked")


async def test_without_the_width_the_answer_still_refuses_after_the_pass() -> None:
    harness = Harness()
    harness.embedder.info = _Unreachable()  # type: ignore[assignment]
    transport = httpx.ASGITransport(app=harness.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        for path, body, param in TOO_WIDE:
            assert_error(await client.post(path, json=body), 400, param)
    assert len(harness.embedder.calls) == len(TOO_WIDE)
