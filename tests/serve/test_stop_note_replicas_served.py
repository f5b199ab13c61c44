"""With two replicas of a generation model, a client that leaves ends its sequence by a stop
note that reaches the replica running it (ingress/calls/stop_note_router.py): the real app,
real HTTP, the demo model at `num_replicas: 2`. Serve's default routing sent the note to
either replica, the wrong one half the time, and the stream was then cancelled instead."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from bench.server import load_config, running_server
from tests.serve.conftest import AUTH

MODEL = "tiny-llama-demo"
LEAVERS = 8


def two_generation_replicas() -> dict:
    """The default app's generation model alone, at two replicas."""
    config = load_config()
    args = config["applications"][0]["args"]
    args["embedding_models"] = []
    args["rerank_models"] = []
    (model,) = [m for m in args["generation_models"] if m["name"] == MODEL]
    model["deployment"]["num_replicas"] = 2
    model["standby_replicas"] = 0  # both serve: the notes must find theirs
    args["generation_models"] = [model]
    return config


# Greedy, as long as the model allows: every run is the same 512 tokens (checked first),
# and a note comes milliseconds after the first of them, while the run has hundreds to go
# beside seven others on two cores.
LONG_RUN = {"model": MODEL, "prompt": "go on", "max_tokens": 512, "temperature": 0}


async def runs_to_its_length(client: httpx.AsyncClient) -> bool:
    response = await client.post("/v1/completions", json=LONG_RUN, headers=AUTH)
    assert response.status_code == 200, response.text
    return bool(response.json()["choices"][0]["finish_reason"] == "length")


async def leave_after_the_first_token(client: httpx.AsyncClient) -> None:
    body = {**LONG_RUN, "stream": True}
    async with client.stream("POST", "/v1/completions", json=body, headers=AUTH) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                return  # leaving closes the connection


async def stats(client: httpx.AsyncClient) -> dict:
    response = await client.get("/v1/stats", headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()["models"][MODEL]


async def remembered_runs(client: httpx.AsyncClient) -> int:
    """What the ingress's stop-note router remembers, once the streams left have ended."""
    for _ in range(100):
        response = await client.get("/v1/stats", headers=AUTH)
        runs = int(response.json()["stop_note_runs"])
        if runs == 0:
            break
        await asyncio.sleep(0.1)
    return runs


async def leave_together(url: str) -> dict:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        # A run that ended on its own before its note would not be the router's miss.
        assert await runs_to_its_length(client), "the condition under test did not arise"
        await asyncio.gather(*(leave_after_the_first_token(client) for _ in range(LEAVERS)))
        notes = (await stats(client))["stop_notes"]
        for _ in range(100):  # each note is sent once its client's close is seen
            if notes["heard"] + notes["not_heard"] >= LEAVERS:
                break
            await asyncio.sleep(0.1)
            notes = (await stats(client))["stop_notes"]
        # Every call completed, so nothing is left remembered: the router's memory is that
        # of the generations in flight.
        assert await remembered_runs(client) == 0
        return notes


def test_every_stop_note_reaches_the_replica_that_runs_its_sequence(tmp_path: Path) -> None:
    with running_server(two_generation_replicas(), tmp_path) as server:
        notes = asyncio.run(leave_together(server.url))
    # With Serve's default routing, each note had one chance in two of finding its run.
    assert notes == {"heard": LEAVERS, "not_heard": 0}, notes
