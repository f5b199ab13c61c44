"""Memory faults lose nothing, served: the fenced MiniLM's replica runs with
`memory_limit_mib`, so a burst of long texts makes its large batches fail in the CPU
allocator for real. They are split and retried, every request gets its own vector, and the
replica counts what happened."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np

from tests.serve.conftest import (
    AUTH,
    FENCED_MODEL,
    MODEL,
    STRICT_BUDGET_MIB,
    STRICT_MODEL,
    Server,
)

REQUESTS = 48


def long_text(i: int) -> str:
    return " ".join(f"w{i}x{j}" for j in range(300))  # past the 256-token window: truncated


def test_a_burst_that_runs_out_of_memory_is_answered_in_full(server: Server) -> None:
    stats_url = f"{server.url}/v1/stats"
    before = httpx.get(stats_url, timeout=30).json()["models"][FENCED_MODEL]["replica"]
    assert before["memory"]["limit"] is not None  # the limit is in force
    assert before["memory"]["address_space"]["room_bytes"] > 0

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
    after = httpx.get(stats_url, timeout=30).json()["models"][FENCED_MODEL]["replica"]
    memory = after["memory"]
    # On a failure, the address space first (pytest cuts long messages): where the room went.
    failed = [r.text[:200] for r in responses if r.status_code != 200]
    room = memory.get("address_space")
    assert not failed, f"address space {room}; {len(failed)} failed: {failed}"
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


def test_stats_show_the_device_and_the_ceiling_the_probe_measured(server: Server) -> None:
    models = httpx.get(f"{server.url}/v1/stats", timeout=30).json()["models"]
    budgeted = models[STRICT_MODEL]["replica"]
    memory = budgeted["memory"]
    probe = memory["probe"]
    print(f"{STRICT_MODEL} under memory_budget_mib {STRICT_BUDGET_MIB}: {probe}")
    assert probe["allowed_from"] == "memory_budget_mib"
    assert probe["allowed_bytes"] == STRICT_BUDGET_MIB * 2**20
    assert all(peak <= probe["allowed_bytes"] for _, peak in probe["points"]), probe
    ceiling = memory["token_ceiling"]
    assert ceiling == probe["token_ceiling"] and 256 <= ceiling < 16384, probe
    for name, plan in budgeted["plans"].items():
        assert plan["max_batch_tokens"] <= ceiling, (name, plan)
        if budgeted["batching"][name]["max_batch_tokens"] > ceiling:  # serve_config's normal
            assert plan["max_batch_tokens"] == ceiling and "memory ceiling" in plan["why"]
    device = memory["device"]
    assert device["kind"] == "cpu" and device["process_measure"] == "rss"
    assert device["total_bytes"] >= device["free_bytes"] > 0 and device["process_bytes"] > 0

    # No budget on a CPU: no probe and no ceiling, but the device is shown.
    plain = models[MODEL]["replica"]["memory"]
    assert plain["probe"] is None and plain["token_ceiling"] is None
    assert plain["device"]["kind"] == "cpu" and plain["device"]["process_bytes"] > 0
