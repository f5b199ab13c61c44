"""Priority classes, shedding and deadlines with the real model over real HTTP."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import httpx

from tests.parts.front_door_support import front_door
from tests.serve.conftest import AUTH, BATCH_QUEUE_ITEMS, MODEL, Server

LONG_TEXT = " ".join(["a long sentence about rivers, trains and quiet gardens"] * 30)


def texts(n: int, tag: str) -> list[str]:
    return [f"{tag} document {i} about rivers, trains and quiet gardens" for i in range(n)]


def long_texts(n: int, tag: str) -> list[str]:
    return [
        f"{tag} document {i} " + "about rivers, trains and quiet gardens " * 5 for i in range(n)
    ]


async def post(
    client: httpx.AsyncClient, server: Server, inputs: str | list[str], **headers: str
) -> tuple[httpx.Response, float]:
    """The response and when it arrived."""
    response = await client.post(
        f"{server.url}/v1/embeddings",
        json={"model": MODEL, "input": inputs},
        headers={**AUTH, **headers},
    )
    return response, time.monotonic()


def stats(server: Server) -> dict:
    return httpx.get(f"{server.url}/v1/stats", timeout=30).json()["models"][MODEL]


def drop_reason(server: Server, request_id: str, timeout_s: float = 20) -> str | None:
    """Why the model replica dropped this request, once it has (None if it never did)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for drop in stats(server)["replica"]["recent_drops"]:
            if drop["request_id"] == request_id:
                return drop["reason"]
        if time.monotonic() > deadline:
            return None
        time.sleep(0.5)


def test_a_realtime_request_overtakes_queued_batch_class_work(server: Server) -> None:
    async def run() -> tuple[list[tuple[float, float, int]], float, float, httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            stop = asyncio.Event()
            bulk: list[tuple[float, float, int]] = []  # (sent, answered, status) of each

            async def keep_sending(worker: int) -> None:
                # ~50 tokens a text: two or three to a batch-class pass (128 padded tokens).
                # Each worker sends again as soon as it is answered, so the bulk never runs
                # dry, however fast the runtime and however many passes run side by side.
                n = 0
                while not stop.is_set():
                    sent = time.monotonic()
                    texts = long_texts(60, f"b{worker}-{n}")
                    response, _ = await post(client, server, texts, **{"X-Priority": "batch"})
                    bulk.append((sent, time.monotonic(), response.status_code))
                    n += 1

            workers = [asyncio.create_task(keep_sending(i)) for i in range(8)]
            await asyncio.sleep(1.0)  # 8 bulk requests of 60 texts are queued and running
            sent = time.monotonic()
            urgent, urgent_done = await post(client, server, "urgent", **{"X-Priority": "realtime"})
            stop.set()
            await asyncio.gather(*workers)
            return bulk, sent, urgent_done, urgent

    bulk, urgent_sent, urgent_done, urgent = asyncio.run(run())
    assert urgent.status_code == 200 and urgent.headers["x-priority"] == "realtime"
    # The bulk requests admitted and not yet answered when the urgent one came: most of
    # them had work left, and the urgent request finished first. (A stall of the machine
    # delays all of them alike, so it cannot turn the order.) The test server's small
    # batch-class queue refuses some bulk requests at once (429): they are not counted.
    in_flight = [done for sent, done, status in bulk if status == 200 and sent < urgent_sent < done]
    overtaken = sum(done > urgent_done for done in in_flight)
    assert len(in_flight) >= 2 and overtaken >= (len(in_flight) + 1) // 2, (
        overtaken,
        in_flight,
        urgent_done,
    )
    replica = stats(server)["replica"]
    assert replica["classes"]["realtime"]["batches"] >= 1
    assert replica["gate"]["busy"] is False and replica["jobs_in_progress"] == 0


def test_under_a_batch_class_flood_batch_gets_429_while_realtime_gets_200(
    server: Server,
) -> None:
    async def run() -> tuple[list[httpx.Response], list[httpx.Response]]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            flood = [
                asyncio.create_task(
                    post(client, server, texts(32, f"f{i}"), **{"X-Priority": "batch"})
                )
                # four times the batch class's queue bound
                for i in range(4 * BATCH_QUEUE_ITEMS // 32)
            ]
            await asyncio.sleep(0.3)
            realtime = []
            for i in range(8):
                realtime.append(
                    (await post(client, server, f"rt {i}", **{"X-Priority": "realtime"}))[0]
                )
                await asyncio.sleep(0.05)
            return [r for r, _ in await asyncio.gather(*flood)], realtime

    flood, realtime = asyncio.run(run())
    assert [r.status_code for r in realtime] == [200] * len(realtime)
    shed = [r for r in flood if r.status_code == 429]
    served = [r for r in flood if r.status_code == 200]
    assert shed and served and len(shed) + len(served) == len(flood)
    for response in shed:
        assert response.json()["error"]["code"] in ("load_shed", "queue_full")
        assert int(response.headers["retry-after"]) >= 1
    batch = stats(server)["ingress"]["classes"]["batch"]
    # HAProxy may refuse some of the flood itself, at the share the ingress published
    # from its first refusals (docs/operations.md, "Refusing at the front door"): those
    # never reach the ingress's count.
    at_the_door = [r for r in shed if r.json() == json.loads(front_door.FRONT_REFUSAL)]
    assert sum(batch["refused"].values()) >= len(shed) - len(at_the_door)
    assert batch["queued_items"] == 0 and batch["in_flight"] == 0


def test_an_expired_request_gets_504_and_the_model_never_computes_it(server: Server) -> None:
    request_id = f"expire-{uuid.uuid4().hex}"
    # The replica runs `passes_in_flight` passes side by side (auto may choose 2): fill
    # every one with 64 texts of ~256 tokens, a full normal-class pass each. How long that
    # takes depends on the runtime `auto` chose (over a second on torch fp32, a few tenths
    # on OpenVINO bf16), so time it first and scale the test's moments to it: the second
    # of two, since a runtime's first pass of a new shape also builds its kernels for it.
    passes = stats(server)["replica"]["passes_in_flight"]

    async def long_passes(client: httpx.AsyncClient) -> list[httpx.Response]:
        sent = [post(client, server, [LONG_TEXT] * 64) for _ in range(passes)]
        return [response for response, _ in await asyncio.gather(*sent)]

    async def timed() -> float:
        async with httpx.AsyncClient(timeout=120) as client:
            started = time.monotonic()
            assert {r.status_code for r in await long_passes(client)} == {200}
            return time.monotonic() - started

    for _ in range(2):
        pass_s = asyncio.run(timed())

    async def run() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            running = asyncio.create_task(long_passes(client))
            await asyncio.sleep(0.2 * pass_s)
            late, _ = await post(
                client,
                server,
                "too late",
                # Long enough to reach the replica, short of the rest of the long passes.
                # The batch class: a realtime one would run beside them in the realtime
                # lane (test_realtime_lane_served.py).
                **{
                    "X-Priority": "batch",
                    "X-Request-Timeout": f"{0.4 * pass_s:.3f}",
                    "X-Request-ID": request_id,
                },
            )
            return late, (await running)[0]

    late, long_done = asyncio.run(run())
    assert long_done.status_code == 200
    assert late.status_code == 504 and late.json()["error"]["code"] == "deadline_exceeded"
    # The batch-class call reached the replica and waited at the gate behind the long passes;
    # when its turn came it was out of time and was dropped instead of computed.
    assert drop_reason(server, request_id) == "expired"
    replica = stats(server)["replica"]
    assert replica["gate"]["busy"] is False and replica["jobs_in_progress"] == 0


def test_a_client_that_disconnects_has_its_input_dropped_before_the_model(
    server: Server,
) -> None:
    request_id = f"leave-{uuid.uuid4().hex}"

    async def wait_at_the_gate(client: httpx.AsyncClient) -> None:
        for _ in range(200):
            stats = (await client.get(f"{server.url}/v1/stats")).json()["models"][MODEL]
            if stats["replica"]["gate"]["waiting"]["batch"]:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the batch-class request never reached the replica's gate")

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(timeout=120) as client:
            # Two long normal-class passes: the batch-class request below waits at the
            # gate behind them (at least its class's ageing time, 1 s).
            long_passes = [
                asyncio.create_task(post(client, server, [LONG_TEXT] * 64)) for _ in range(2)
            ]
            await asyncio.sleep(0.4)
            impatient = httpx.AsyncClient(timeout=120)
            leaving = asyncio.create_task(
                post(
                    impatient,
                    server,
                    "never mind",
                    **{"X-Priority": "batch", "X-Request-ID": request_id},
                )
            )
            # Once it waits at the gate, its client gives up and closes the connection.
            await wait_at_the_gate(client)
            leaving.cancel()
            await impatient.aclose()
            return (await asyncio.gather(*long_passes))[0][0]

    assert asyncio.run(run()).status_code == 200
    reason = drop_reason(server, request_id)
    ingress = stats(server)["ingress"]["classes"]["batch"]
    assert reason == "client_gone", ingress
    replica = stats(server)["replica"]
    assert replica["gate"]["busy"] is False and replica["jobs_in_progress"] == 0
    assert ingress["in_flight"] == 0 and ingress["queued_items"] == 0
