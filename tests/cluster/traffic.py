"""Closed-loop load for the cluster tests: N clients, each sending its next request as soon
as the last one is answered (or, refused, after its Retry-After), every outcome recorded
with its start time and duration."""

from __future__ import annotations

import asyncio
import contextlib
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
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200

    @property
    def refused(self) -> bool:
        """Turned away by admission, as the API promises: 429/503 that says when to retry
        (not a failure's 503: that one says the replica went)."""
        if self.status not in (429, 503) or self.retry_after_s is None:
            return False
        error = self.body.get("error", {}) if isinstance(self.body, dict) else {}
        return error.get("code") in ADMISSION_CODES


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
    retry_after = response.headers.get("retry-after")
    return Outcome(
        started,
        time.monotonic() - started,
        response.status_code,
        body,
        None if retry_after is None else float(retry_after),
    )


ADMISSION_CODES = {"load_shed", "queue_full"}
MAX_BACKOFF_S = 2.0  # the longest a refused client waits, so the load stays on


async def wait_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


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
            outcome = await one_request(client, url, model, inputs, timeout_s)
            outcomes.append(outcome)
            if outcome.refused and outcome.retry_after_s is not None:
                # A client that does as it is told; a loop that ignored it would spend the
                # machine's two cores on refusals.
                await wait_or_stop(stop, min(outcome.retry_after_s, MAX_BACKOFF_S))

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    return outcomes
