"""The realtime lane with the real model over real HTTP: a realtime request is answered
while a long pass of another class still holds the model's threads."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.serve.conftest import Server
from tests.serve.test_priorities_served import LONG_TEXT, post, stats


def test_a_realtime_request_runs_beside_a_long_pass_instead_of_after_it(server: Server) -> None:
    replica = stats(server)["replica"]
    assert replica["gate"]["lane"] is True, replica["gate"]  # the default on a CPU
    assert replica["runtime"]["realtime_lane"] == {"threads": 1}
    passes = replica["passes_in_flight"]

    async def long_passes(client: httpx.AsyncClient) -> list[tuple[httpx.Response, float]]:
        return await asyncio.gather(
            *(post(client, server, [LONG_TEXT] * 64) for _ in range(passes))
        )

    async def timed() -> float:
        async with httpx.AsyncClient(timeout=120) as client:
            started = time.monotonic()
            assert {r.status_code for r, _ in await long_passes(client)} == {200}
            return time.monotonic() - started

    # The second timing: a runtime's first pass of a shape also builds its kernels.
    for _ in range(2):
        pass_s = asyncio.run(timed())
    lane_turns = stats(server)["replica"]["gate"]["lane_turns"]

    async def run() -> tuple[list[tuple[httpx.Response, float]], httpx.Response, float]:
        async with httpx.AsyncClient(timeout=120) as client:
            running = asyncio.create_task(long_passes(client))
            await asyncio.sleep(0.3 * pass_s)  # the long passes hold every model thread
            urgent, urgent_done = await post(client, server, "urgent", **{"X-Priority": "realtime"})
            return await running, urgent, urgent_done

    long_done, urgent, urgent_done = asyncio.run(run())
    assert urgent.status_code == 200 and len(urgent.json()["data"]) == 1
    assert {r.status_code for r, _ in long_done} == {200}
    # Answered before the passes it arrived behind had ended: it did not wait them out.
    assert urgent_done < min(done for _, done in long_done), (urgent_done, long_done, pass_s)
    gate = stats(server)["replica"]["gate"]
    assert gate["lane_turns"] >= lane_turns + 1
    assert gate["lane_busy"] is False and gate["busy"] is False
