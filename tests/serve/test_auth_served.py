"""API keys against the real application: the whole auth matrix over real HTTP."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.serve.conftest import ADMIN_KEY, BULK_KEY, LIMITED_KEY, MODEL, STRICT_MODEL, Server


def post(server: Server, key: str | None, model: str = MODEL, **headers: str) -> httpx.Response:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(
        f"{server.url}/v1/embeddings",
        json={"model": model, "input": "auth check"},
        headers=headers,
        timeout=60,
    )


def code(response: httpx.Response) -> str:
    return response.json()["error"]["code"]


def test_no_key_and_a_wrong_key_are_401(server: Server) -> None:
    missing = post(server, None)
    assert missing.status_code == 401 and code(missing) == "invalid_api_key"
    wrong = post(server, "trib-not-a-key")
    assert wrong.status_code == 401 and code(wrong) == "invalid_api_key"


def test_a_model_the_key_may_not_use_is_403(server: Server) -> None:
    denied = post(server, BULK_KEY, STRICT_MODEL)
    assert denied.status_code == 403 and code(denied) == "model_not_allowed"
    assert post(server, ADMIN_KEY, STRICT_MODEL).status_code == 200


def test_the_tier_caps_the_priority(server: Server) -> None:
    capped = post(server, BULK_KEY, **{"X-Priority": "realtime"})
    assert capped.status_code == 200 and capped.headers["x-priority"] == "batch"
    full = post(server, ADMIN_KEY, **{"X-Priority": "realtime"})
    assert full.headers["x-priority"] == "realtime"


def test_over_the_rate_limit_is_429_with_retry_after(server: Server) -> None:
    # 1 request/s with a burst of 2; three requests at once. (One after another, the
    # third would come only after two whole answers, which can take over a second on a
    # busy machine: the bucket would have a token for it again.)
    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda _: post(server, LIMITED_KEY), range(3)))
    assert sorted(a.status_code for a in answers) == [200, 200, 429]
    (refused,) = (a for a in answers if a.status_code == 429)
    assert code(refused) == "rate_limit_exceeded"
    assert int(refused.headers["retry-after"]) >= 1
    assert post(server, ADMIN_KEY).status_code == 200  # other tenants are not slowed
