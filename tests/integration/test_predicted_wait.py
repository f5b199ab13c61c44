"""Admission by predicted wait over HTTP, with a fake model whose calls the tests hold open
and a predictor given its measurements by hand."""

from __future__ import annotations

import asyncio
import copy

import httpx
import pytest

from deployments.core.admission.job_work import PER_SEQUENCE_TOKENS
from deployments.core.admission.wait_predictor import WaitPredictor
from tests.integration.conftest import CONFIG, Harness
from tests.integration.test_embeddings_route import assert_error
from tests.integration.test_priorities import MODEL, post, settle


@pytest.fixture
def harness() -> Harness:
    """The usual harness with admission by predicted wait on (the app's default; the
    shared test config turns it off so other tests' fakes are not refused)."""
    config = copy.deepcopy(CONFIG)
    config["ingress"]["admission"]["predict_wait"] = True
    return Harness(config)


def predictor(harness: Harness) -> WaitPredictor:
    client = harness.ingress.catalog.table(MODEL).choose(None, {}).client
    assert client is not None
    return client.queues.predictor


def measured(harness: Harness, work_per_s: float, floor_s: float) -> None:
    """As if the model had shown `work_per_s` for a busy second and a call of `floor_s`.
    A one-character text weighs PER_SEQUENCE_TOKENS (8): 800 is 100 of them a second."""
    assert PER_SEQUENCE_TOKENS == 8
    wait = predictor(harness)
    wait.rate._windows.append(work_per_s)
    wait.note_job(PER_SEQUENCE_TOKENS, 1)
    wait.set_capacity(work_per_s / PER_SEQUENCE_TOKENS)  # the replica's figure agrees
    wait.call_took(floor_s)


async def test_a_request_not_expected_within_its_target_is_refused_at_once(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    measured(harness, work_per_s=800, floor_s=0.05)
    harness.embedder.gate.clear()
    held = [asyncio.create_task(post(client, 10, "normal")) for _ in range(4)]
    await settle()  # 40 inputs ahead: 0.05 + 41 / 100 s = 460 ms, within normal's 500
    admitted = asyncio.create_task(post(client, 1, "normal"))
    await settle()
    assert not admitted.done()
    refused = await post(client, 5, "normal")  # 0.05 + 46 / 100 s: over
    error = assert_error(refused, 429)
    assert error["code"] == "load_shed" and "ms left of their target" in error["message"]
    assert int(refused.headers["retry-after"]) == 1
    # batch counts the same work ahead against its own, longer target
    batch = asyncio.create_task(post(client, 5, "batch"))
    await settle()
    assert not batch.done()
    harness.embedder.gate.set()
    done = await asyncio.gather(*held, admitted, batch)
    assert [r.status_code for r in done] == [200] * len(done)
    stats = (await client.get("/v1/stats")).json()["models"][MODEL]["ingress"]
    assert stats["classes"]["normal"]["refused"] == {"wait": 1}
    assert stats["predicted_wait"]["work_per_busy_s"] == 800


async def test_a_deadline_shorter_than_the_target_refuses_earlier(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    measured(harness, work_per_s=800, floor_s=0.05)
    harness.embedder.gate.clear()
    held = asyncio.create_task(post(client, 10, "normal"))
    await settle()  # 0.05 + 11 / 100 s = 160 ms predicted for one more input
    refused = await post(client, 1, "normal", **{"X-Request-Timeout": "0.1"})
    assert assert_error(refused, 429)["code"] == "load_shed"
    harness.embedder.gate.set()
    assert (await held).status_code == 200


async def test_realtime_refused_by_prediction_gets_503(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    measured(harness, work_per_s=800, floor_s=0.05)
    harness.embedder.gate.clear()
    held = asyncio.create_task(post(client, 10, "realtime"))
    await settle()  # 0.05 + 11 / 100 s = 160 ms: over realtime's 100 ms
    refused = await post(client, 1, "realtime")
    assert assert_error(refused, 503)["code"] == "load_shed"
    assert "retry-after" in refused.headers
    harness.embedder.gate.set()
    assert (await held).status_code == 200
