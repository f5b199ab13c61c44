"""The hostile corpus (issue 12) sent one request at a time while long generation streams
run back to back: every stream must finish intact, every hostile request gets a 4xx (or
200 where it is valid) in the documented error shape, never a 5xx or a hang, and
generation still answers afterwards."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from bench.http_response import read_response
from bench.server import Server
from tests.reliability import report
from tests.reliability.conftest import wait_for_generation
from tests.reliability.hostile import Hostile, corpus
from tests.reliability.shapes import error_shape_problem, histogram
from tests.reliability.streams import StreamOutcome, long_stream

pytestmark = pytest.mark.reliability

# Each hostile request carries a deadline; an answer later than the client's timeout is
# a hang.
DEADLINE = {"X-Request-Timeout": "10"}
CLIENT_TIMEOUT_S = 15


async def send(client: httpx.AsyncClient, server: Server, case: Hostile) -> tuple[int, bytes]:
    if case.raw is not None:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(case.raw)
            status, body, *_ = await read_response(reader)
        finally:
            writer.close()
        return status, body
    headers = {"Content-Type": "application/json", **DEADLINE, **case.headers}
    answer = await client.request(
        case.method, f"{server.url}{case.path}", content=case.body, headers=headers
    )
    return answer.status_code, answer.content


def check(case: Hostile, status: int, body: bytes) -> str | None:
    if case.raw is not None:
        return None if status == 400 else f"{status} (allowed 400): {body[:160]!r}"
    if status not in case.allowed:
        return f"{status} (allowed {_ranges(case.allowed)}): {body[:160]!r}"
    if case.method == "HEAD":
        return f"HEAD answered with a body: {body[:80]!r}" if body else None
    if status >= 400:
        return error_shape_problem(body)
    return None


def _ranges(statuses: frozenset[int]) -> str:
    return (
        "4xx or 200"
        if 200 in statuses and len(statuses) > 1
        else ("4xx" if len(statuses) > 1 else str(sorted(statuses)[0]))
    )


@pytest.mark.timeout(900)
async def test_hostile_inputs_leave_a_concurrent_stream_intact(
    server: Server, models: dict[str, list[str]]
) -> None:
    llm = models["generation"][0]
    await asyncio.to_thread(wait_for_generation, server, llm)
    cases = corpus(models)
    statuses: list[int] = []
    failures: list[str] = []
    front_door_html: list[str] = []  # malformed HTTP answered outside the JSON shape
    streams: list[StreamOutcome] = []
    stop = asyncio.Event()
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=httpx.Timeout(CLIENT_TIMEOUT_S)) as client:

        async def keep_streaming() -> None:
            while not stop.is_set():
                streams.append(await long_stream(client, server.url, llm))

        streamer = asyncio.create_task(keep_streaming())
        await asyncio.sleep(1.0)  # the first stream is under way
        for case in cases:
            try:
                async with asyncio.timeout(CLIENT_TIMEOUT_S):
                    status, body = await send(client, server, case)
            except (TimeoutError, httpx.TimeoutException):
                failures.append(f"{case.name}: no answer within {CLIENT_TIMEOUT_S}s")
                continue
            except (httpx.HTTPError, OSError, asyncio.IncompleteReadError) as exc:
                failures.append(f"{case.name}: connection failed: {type(exc).__name__} {exc}")
                continue
            statuses.append(status)
            if case.raw is not None and error_shape_problem(body) is not None:
                front_door_html.append(case.name)
            problem = check(case, status, body)
            if problem is not None:
                failures.append(f"{case.name}: {problem}")
        stop.set()
        await streamer
    await asyncio.to_thread(wait_for_generation, server, llm, 5)
    broken = [f"stream {i}: {s.problem()}" for i, s in enumerate(streams) if s.problem()]
    report.record(
        "hostile_corpus",
        {
            "cases": len(cases),
            "status_histogram": histogram(statuses),
            "front_door_non_json_400": front_door_html,
            "streams": len(streams),
            "streams_intact": len(streams) - len(broken),
            "stream_seconds": [round(s.seconds, 1) for s in streams],
            "seconds": round(time.monotonic() - started, 1),
            "failures": broken + failures,
        },
    )
    assert not broken, f"concurrent streams broken: {broken}"
    assert not failures, f"{len(failures)} hostile requests mishandled, first: {failures[:5]}"
