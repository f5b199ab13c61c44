"""Priority classes, shedding, deadlines and cancellation at the ingress, with a fake
model whose calls the tests hold open."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.integration.conftest import Harness
from tests.integration.test_embeddings_route import assert_error
from tests.waiting import until

MODEL = "fake-embedder"


def post(client: httpx.AsyncClient, texts: int | str = "a", priority: str | None = None, **kw):
    payload = {"model": MODEL, "input": texts if isinstance(texts, str) else ["x"] * texts}
    headers = {"X-Priority": priority} if priority else {}
    return client.post("/v1/embeddings", json=payload, headers={**headers, **kw})


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0.01)


async def test_the_class_comes_from_the_header_or_the_body_and_is_echoed(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    plain = await post(client)
    assert plain.status_code == 200 and plain.headers["x-priority"] == "normal"
    header = await post(client, priority="realtime")
    assert header.headers["x-priority"] == "realtime"
    body = await client.post(
        "/v1/embeddings", json={"model": MODEL, "input": "a", "priority": "batch"}
    )
    assert body.headers["x-priority"] == "batch"
    assert harness.embedder.priorities == ["normal", "realtime", "batch"]


async def test_a_bad_or_conflicting_priority_is_a_400(client: httpx.AsyncClient) -> None:
    assert_error(await post(client, priority="urgent"), 400, "X-Priority")
    conflict = await client.post(
        "/v1/embeddings",
        json={"model": MODEL, "input": "a", "priority": "batch"},
        headers={"X-Priority": "realtime"},
    )
    assert_error(conflict, 400, "priority")


async def test_bad_timeouts_are_a_400(client: httpx.AsyncClient) -> None:
    for value in ["soon", "0", "-1", "nan", "99999"]:
        assert_error(await post(client, **{"X-Request-Timeout": value}), 400, "X-Request-Timeout")


async def test_realtime_goes_out_while_the_batch_class_call_is_held(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    harness.embedder.gate.clear()
    held = asyncio.create_task(post(client, 3, "batch"))
    await settle()
    # The realtime call leaves at once, beside the held batch-class call (its own
    # coalescer), rather than queueing behind it.
    realtime = asyncio.create_task(post(client, "now", "realtime"))
    await settle()
    assert harness.embedder.priorities == ["batch", "realtime"]
    harness.embedder.gate.set()
    assert (await realtime).status_code == 200 and (await held).status_code == 200


async def test_batch_is_shed_first_then_normal_and_realtime_only_at_its_own_bound(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    # Config: shed batch above 20 queued inputs (all classes), normal above 40;
    # realtime's own queue holds 20. One call per class in flight, held open.
    harness.embedder.gate.clear()
    in_flight = [asyncio.create_task(post(client, 1, p)) for p in ("normal", "realtime")]
    await settle()
    queued = [asyncio.create_task(post(client, 10, "normal")) for _ in range(2)]
    await settle()  # 20 normal inputs queued
    shed = await post(client, 1, "batch")
    assert assert_error(shed, 429)["code"] == "load_shed"
    assert int(shed.headers["retry-after"]) >= 1
    more = [asyncio.create_task(post(client, 10, "normal"))]
    await settle()  # 30 queued: normal still welcome
    assert all(not t.done() for t in more)
    more.append(asyncio.create_task(post(client, 10, "normal")))
    await settle()  # 40 queued
    refused = await post(client, 1, "normal")
    assert assert_error(refused, 429)["code"] == "load_shed"
    realtime = [asyncio.create_task(post(client, 10, "realtime")) for _ in range(2)]
    await settle()  # realtime queues despite the load: 20 of its own
    full = await post(client, 1, "realtime")
    assert assert_error(full, 503)["code"] == "queue_full"
    assert "retry-after" in full.headers
    harness.embedder.gate.set()
    done = await asyncio.gather(*in_flight, *queued, *more, *realtime)
    assert [r.status_code for r in done] == [200] * len(done)
    stats = (await client.get("/v1/stats")).json()["models"][MODEL]["ingress"]["classes"]
    assert stats["batch"]["refused"] == {"shed": 1}
    assert stats["normal"]["refused"] == {"shed": 1}
    assert stats["realtime"]["refused"] == {"queue_full": 1}
    assert all(c["queued_items"] == 0 and c["in_flight"] == 0 for c in stats.values())


async def test_a_request_expiring_in_the_queue_gets_504_and_never_reaches_the_model(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    harness.embedder.gate.clear()
    held = asyncio.create_task(post(client, "first"))
    await settle()
    late = await post(client, "late", **{"X-Request-Timeout": "0.05"})
    assert assert_error(late, 504)["code"] == "deadline_exceeded"
    harness.embedder.gate.set()
    assert (await held).status_code == 200
    await settle()
    sent = [job.texts for call in harness.embedder.calls for job in call]
    assert sent == [["first"]]
    normal = (await client.get("/v1/stats")).json()["models"][MODEL]["ingress"]["classes"]
    assert normal["normal"]["expired"] == 1 and normal["normal"]["queued_items"] == 0


async def test_the_deadline_travels_with_the_job(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    await post(client, **{"X-Request-Timeout": "7"})
    await post(client, priority="realtime")
    (told,), (default,) = harness.embedder.time_left
    assert 6 < told <= 7
    assert 4 < default <= 5  # the realtime class default in the test config


async def test_the_time_a_request_waited_at_the_ingress_travels_with_its_job(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    harness.embedder.gate.clear()
    started = time.monotonic()
    held = asyncio.create_task(post(client, "first"))
    await until(lambda: harness.embedder.calls)  # the first is at the replica, held there
    sent_by = time.monotonic() - started  # so it waited no longer than this at the ingress
    queued = asyncio.create_task(post(client, "second"))  # waits behind the held call

    async def second_queued() -> bool:
        stats = (await client.get("/v1/stats")).json()["models"][MODEL]["ingress"]
        return stats["classes"]["normal"]["queued_jobs"] == 1

    await until(second_queued)
    # The ingress noted its arrival before it queued, so it waits at least from here to the
    # release. (Not the sleep alone: a sleep begun before the request reached the ingress
    # can end less than 0.3 s after it did.)
    queued_by = time.monotonic()
    await asyncio.sleep(0.3)
    released = time.monotonic()
    harness.embedder.gate.set()
    assert (await held).status_code == 200 and (await queued).status_code == 200
    (first,), (second,) = harness.embedder.spent
    assert 0 <= first <= sent_by
    # The replica judges a latency target from the ingress on.
    assert released - queued_by <= second < 30


async def test_a_sent_request_past_its_deadline_gets_504_at_the_deadline(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    harness.embedder.gate.clear()
    response = await post(client, **{"X-Request-Timeout": "0.1"})
    assert assert_error(response, 504)["code"] == "deadline_exceeded"
    await settle()
    # It was the call's only job: the call itself was cancelled.
    assert harness.embedder.cancelled_calls == 1
    harness.embedder.gate.set()


async def test_a_client_leaving_a_shared_call_is_named_to_the_model(
    client: httpx.AsyncClient, harness: Harness
) -> None:
    first_gate = harness.embedder.gate
    first_gate.clear()
    first = asyncio.create_task(post(client, "first"))
    await settle()
    shared = [asyncio.create_task(post(client, f"t{i}")) for i in range(3)]
    await settle()
    # The first call returns; the three queued requests leave together in a second
    # call, which is held.
    harness.embedder.gate = asyncio.Event()
    first_gate.set()
    assert (await first).status_code == 200
    await settle()
    assert [len(call) for call in harness.embedder.calls] == [1, 3]
    shared[0].cancel()  # the client goes away while its call is out
    await settle()
    assert harness.embedder.forgotten == [harness.embedder.calls[1][0].job_id]
    harness.embedder.gate.set()
    assert [r.status_code for r in await asyncio.gather(*shared[1:])] == [200, 200]
    normal = (await client.get("/v1/stats")).json()["models"][MODEL]["ingress"]["classes"]
    assert normal["normal"]["abandoned"] == 1 and normal["normal"]["in_flight"] == 0
