"""Turns at the shared device, served: the real embedder, reranker and LLM of the test
app take turns at one table (this node's CPU), count them per class in /v1/stats, export
them to Prometheus, and a pass waiting behind another model's flood still gets its turn."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from tests.serve.conftest import AUTH, MODEL, RERANK_MODEL, Server
from tests.serve.test_metrics_served import total, wait_for

LLM = "tiny-llama-demo"


def stats(server: Server) -> dict:
    return httpx.get(f"{server.url}/v1/stats", timeout=30).json()


def turns_of(server: Server, model: str) -> dict:
    turns = stats(server)["models"][model]["replica"]["device_turns"]
    assert turns is not None, f"{model} takes no turns"
    return turns


def batch_rerank(server: Server, query: str) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/rerank",
        json={"model": RERANK_MODEL, "query": query, "documents": ["one", "two"]},
        headers={**AUTH, "X-Priority": "batch"},
        timeout=60,
    )


def test_every_model_takes_turns_at_one_table_per_class(server: Server) -> None:
    before = turns_of(server, MODEL)["by_class"].get("realtime", {}).get("turns", 0)
    for _ in range(3):
        response = httpx.post(
            f"{server.url}/v1/embeddings",
            json={"model": MODEL, "input": "a realtime pass takes a turn"},
            headers={**AUTH, "X-Priority": "realtime"},
            timeout=60,
        )
        assert response.status_code == 200
    assert batch_rerank(server, "turns").status_code == 200
    chat = httpx.post(
        f"{server.url}/v1/chat/completions",
        json={"model": LLM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        headers={**AUTH, "X-Priority": "normal"},
        timeout=120,
    )
    assert chat.status_code == 200
    embedder, reranker, llm = (turns_of(server, m) for m in (MODEL, RERANK_MODEL, LLM))
    # One device (this node's CPU), one table, every model's replica on it.
    assert embedder["table"] == reranker["table"] == llm["table"]
    assert embedder["table"].endswith("-cpu.turns")
    assert embedder["replicas_on_device"] >= 3
    assert embedder["by_class"]["realtime"]["turns"] >= before + 3
    assert reranker["by_class"]["batch"]["turns"] >= 1
    # One turn per engine step: at least one step per generated token.
    assert llm["by_class"]["normal"]["turns"] >= chat.json()["usage"]["completion_tokens"]
    assert 0.0 <= embedder["share"] <= 1.0
    # The per-class figures of /v1/stats carry them too.
    realtime = stats(server)["models"][MODEL]["classes"]["realtime"]
    assert realtime["device_turns"] >= 3 and realtime["device_wait_ms"] >= 0


def test_turns_waits_and_held_time_reach_prometheus(server: Server) -> None:
    response = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"model": MODEL, "input": "exported"},
        headers={**AUTH, "X-Priority": "normal"},
        timeout=60,
    )
    assert response.status_code == 200

    def exported(samples: list) -> bool:
        return (
            total(samples, "ray_tributary_device_turns_total", model=MODEL, priority="normal") > 0
            and total(samples, "ray_tributary_device_turn_wait_seconds_count", model=MODEL) > 0
            and total(samples, "ray_tributary_device_held_seconds_total", model=MODEL) > 0
        )

    samples = wait_for(server, exported)
    assert exported(samples)
    assert {n for n, _, _ in samples} >= {"ray_tributary_device_share"}


async def _flood_while_realtime(server: Server) -> tuple[list[int], int]:
    """A batch-class rerank flood while realtime embeddings go to another model."""
    texts = [f"flood text number {i} with a few more words" for i in range(32)]
    stop = asyncio.Event()
    flooded = 0

    async def flood(client: httpx.AsyncClient) -> None:
        nonlocal flooded
        while not stop.is_set():
            r = await client.post(
                f"{server.url}/v1/rerank",
                json={"model": RERANK_MODEL, "query": "flood", "documents": texts},
                headers={**AUTH, "X-Priority": "batch"},
                timeout=120,
            )
            flooded += r.status_code == 200

    async with httpx.AsyncClient(timeout=120) as client:
        floods = [asyncio.create_task(flood(client)) for _ in range(3)]
        statuses = []
        for i in range(10):
            r = await client.post(
                f"{server.url}/v1/embeddings",
                json={"model": MODEL, "input": f"realtime beside a flood {i}"},
                headers={**AUTH, "X-Priority": "realtime"},
            )
            statuses.append(r.status_code)
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*floods)
    return statuses, flooded


def process_state(pid: int) -> str:
    """The kernel's one-letter state of a process: T while it is stopped."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def batch_passes(server: Server, model: str) -> int:
    """The batch-class passes `model`'s replica has run."""
    return int(stats(server)["models"][model]["replica"]["classes"]["batch"]["batches"])


def lane_turns(server: Server, model: str) -> int:
    return int(stats(server)["models"][model]["replica"]["gate"]["lane_turns"])


def test_realtime_passes_get_their_turns_beside_another_models_flood(server: Server) -> None:
    before = turns_of(server, MODEL)["by_class"].get("realtime", {}).get("turns", 0)
    lane_before = lane_turns(server, MODEL)
    flood_before = turns_of(server, RERANK_MODEL)["by_class"].get("batch", {}).get("turns", 0)
    passes_before = batch_passes(server, RERANK_MODEL)
    statuses, flooded = asyncio.run(_flood_while_realtime(server))
    assert statuses == [200] * 10
    assert flooded >= 1
    after = turns_of(server, MODEL)["by_class"]["realtime"]
    # Each realtime pass ran: with a device turn where one was free at once, else in the
    # embedder's realtime lane beside the flood's pass (which takes no turn).
    in_lane = lane_turns(server, MODEL) - lane_before
    assert after["turns"] - before + in_lane >= 10, (after, before, in_lane)
    flood_turns = turns_of(server, RERANK_MODEL)["by_class"]["batch"]["turns"]
    # The flood's passes took their turns too, one each. (Not one per answered request: a
    # pass may hold the documents of two, coalesced into one call while the reranker's
    # realtime and normal classes are idle and its batch class runs full passes.)
    flood_passes = batch_passes(server, RERANK_MODEL) - passes_before
    assert flood_turns - flood_before >= flood_passes >= 1, (flood_turns, flood_passes)
    # A realtime pass stops the flood's pass while it runs (pause_for_realtime), and
    # lets it go on after: the reranker is not left stopped, and still answers.
    embedder = turns_of(server, MODEL)
    assert embedder["paused"] >= 0
    assert (embedder["paused"] == 0) == (embedder["paused_s"] == 0)
    reranker_pid = stats(server)["models"][RERANK_MODEL]["replica"]["pid"]
    assert process_state(reranker_pid) != "T"
    assert batch_rerank(server, "after the flood").status_code == 200
