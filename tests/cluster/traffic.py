"""Closed-loop load for the cluster tests: N clients, each sending its next request as soon
as the last one is answered, every outcome recorded with its start time and duration."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Outcome:
    started: float  # time.monotonic() when the request was sent
    seconds: float
    status: int | None  # None: no HTTP answer at all (timeout, connection error)
    body: Any

    @property
    def ok(self) -> bool:
        return self.status == 200


def texts(count: int) -> list[str]:
    return [f"Sentence number {i} about rivers joining into a tributary." for i in range(count)]


async def one_request(
    client: httpx.AsyncClient, url: str, model: str, inputs: int, timeout_s: float
) -> Outcome:
    return await embed(client, url, {"model": model, "input": texts(inputs)}, timeout_s)


async def embed(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], timeout_s: float
) -> Outcome:
    started = time.monotonic()
    try:
        response = await client.post(f"{url}/v1/embeddings", json=body, timeout=timeout_s)
    except httpx.HTTPError as exc:
        return Outcome(started, time.monotonic() - started, None, repr(exc))
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    if response.status_code == 200:
        body = None  # the vectors are not needed, only that they came
    return Outcome(started, time.monotonic() - started, response.status_code, body)


async def closed_loop(
    url: str,
    model: str,
    *,
    clients: int,
    stop: asyncio.Event,
    inputs: int = 32,
    timeout_s: float = 30,
) -> list[Outcome]:
    """Runs until `stop` is set; requests in flight then are awaited, not abandoned."""
    outcomes: list[Outcome] = []

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            outcomes.append(await one_request(client, url, model, inputs, timeout_s))

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    return outcomes
