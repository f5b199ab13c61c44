"""Memory faults lose nothing, served: the fenced MiniLM's replica runs with
`memory_limit_mib`, so a burst of long texts makes its large batches fail in the CPU
allocator for real. They are split and retried, every request gets its own vector, and the
replica counts what happened."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np

from tests.serve.conftest import AUTH, FENCED_MODEL, MODEL, Server

REQUESTS = 48


def long_text(i: int) -> str:
    return " ".join(f"w{i}x{j}" for j in range(300))  # past the 256-token window: truncated


def test_a_burst_that_runs_out_of_memory_is_answered_in_full(server: Server) -> None:
    stats_url = f"{server.url}/v1/stats"
    before = httpx.get(stats_url, timeout=30).json()["models"][FENCED_MODEL]["replica"]
    assert before["memory"]["limit"] is not None  # the limit is in force

    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=REQUESTS)
        async with httpx.AsyncClient(limits=limits, timeout=180, headers=AUTH) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        f"{server.url}/v1/embeddings",
                        json={"model": FENCED_MODEL, "input": [long_text(i), long_text(i + 1)]},
                    )
                    for i in range(REQUESTS)
                )
            )

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * REQUESTS, [
        r.text[:200] for r in responses if r.status_code != 200
    ]
    after = httpx.get(stats_url, timeout=30).json()["models"][FENCED_MODEL]["replica"]
    memory = after["memory"]
    print(f"fenced replica after the burst: {memory}, {after['batches']} batches")
    assert memory["out_of_memory"] > before["memory"]["out_of_memory"], after
    assert memory["split_retries"] > 0 and memory["failed_alone"] == 0
    assert after["pid"] == before["pid"]  # the replica lived through it

    # The vectors are the ones the unfenced model gives the same text.
    reference = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"model": MODEL, "input": [long_text(0), long_text(1)]},
        headers=AUTH,
        timeout=60,
    ).json()["data"]
    fenced = responses[0].json()["data"]
    for got, want in zip(fenced, reference, strict=True):
        assert float(np.dot(got["embedding"], want["embedding"])) > 0.9999
