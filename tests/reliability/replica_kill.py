"""Load on one model while its replica is killed: each request timed from send to
answer, with its status and whether a refusal carried Retry-After, and /healthz polled.
Figures are in seconds since the kill."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx


def chat_body(model: str, max_tokens: int) -> dict[str, object]:
    """The short chat completion the kill tests, the soak's probe and the wait for a
    serving model send."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
    }


def replica_pid(url: str, model: str) -> int:
    """The pid of `model`'s replica, as the server at `url` reports it in /v1/stats."""
    stats = httpx.get(f"{url}/v1/stats", timeout=10).json()
    return int(stats["models"][model]["replica"]["pid"])


@dataclass(frozen=True)
class Answer:
    sent: float  # time.monotonic()
    done: float
    status: int | None  # None: no answer (the client gave up or the connection failed)
    retry_after: bool
    body: bytes = b""  # of a non-200 answer, for the report

    @property
    def seconds(self) -> float:
        return self.done - self.sent


@dataclass
class KillRun:
    answers: list[Answer] = field(default_factory=list)
    health: list[tuple[float, int | None]] = field(default_factory=list)
    killed_at: float = float("inf")

    def since_kill(self) -> float:
        return time.monotonic() - self.killed_at

    def after_kill(self) -> list[Answer]:
        return sorted((a for a in self.answers if a.done >= self.killed_at), key=lambda a: a.done)

    def first_after_kill(self, wanted: int) -> float | None:
        return self._since(next((a.done for a in self.after_kill() if a.status == wanted), None))

    def first_failure_after_kill(self) -> float | None:
        return self._since(next((a.done for a in self.after_kill() if a.status != 200), None))

    def recovery_s(self) -> float | None:
        """Seconds from the kill until every later answer was a 200: when the first 200
        after the last non-200 came."""
        after = self.after_kill()
        bad = [a.done for a in after if a.status != 200]
        if not bad:
            return 0.0
        first_good = (a.done for a in after if a.status == 200 and a.done > bad[-1])
        return self._since(next(first_good, None))

    def health_not_ok_s(self) -> float | None:
        down = (t for t, s in self.health if t >= self.killed_at and s != 200)
        return self._since(next(down, None))

    def recovered(self, streak: int) -> bool:
        """The last `streak` answers, all to requests sent after the kill, were 200s."""
        tail = sorted((a for a in self.answers if a.sent >= self.killed_at), key=lambda a: a.done)
        tail = tail[-streak:]
        return len(tail) == streak and all(a.status == 200 for a in tail)

    def _since(self, moment: float | None) -> float | None:
        return None if moment is None else moment - self.killed_at


async def closed_loop(
    client: httpx.AsyncClient,
    run: KillRun,
    url: str,
    body: dict,
    headers: dict[str, str],
    stop: asyncio.Event,
) -> None:
    """One client that sends its next request when the last one is answered."""
    while not stop.is_set():
        sent = time.monotonic()
        try:
            answer = await client.post(url, json=body, headers=headers)
            status, retry = answer.status_code, "retry-after" in answer.headers
            detail = b"" if status == 200 else answer.content[:200]
        except httpx.HTTPError as exc:
            status, retry, detail = None, False, repr(exc).encode()[:200]
        run.answers.append(Answer(sent, time.monotonic(), status, retry, detail))
        if status != 200:
            await asyncio.sleep(0.1)  # a refused client does not spin


async def poll_health(
    client: httpx.AsyncClient, run: KillRun, url: str, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        try:
            status: int | None = (await client.get(f"{url}/healthz", timeout=2)).status_code
        except httpx.HTTPError:
            status = None
        run.health.append((time.monotonic(), status))
        await asyncio.sleep(0.25)
