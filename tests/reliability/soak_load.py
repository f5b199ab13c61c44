"""The soak's mixed load, one minute at a time: open loops of embeddings (every class) and
rerank, closed loops of generations (streamed and whole), and clients that leave before
their answer. Each minute returns a tally per stream: answered latencies, refusals,
unanswered."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
import orjson

from bench.open_loop import OpenLoopResult, run_open_loop
from bench.server import Server

REQUEST_TIMEOUT_S = 90  # past every class's deadline: a request unanswered then was lost
JSON = {"Content-Type": "application/json"}


@dataclass
class Tally:
    """One stream's minute."""

    latencies_s: list[float] = field(default_factory=list)  # 200s
    refusals: int = 0  # 429/503, each with Retry-After
    refusals_without_retry_after: int = 0
    other: dict[int, int] = field(default_factory=dict)  # any other status
    other_bodies: dict[int, str] = field(default_factory=dict)  # the first of each
    unanswered: int = 0
    left: int = 0  # clients that went away on purpose

    @classmethod
    def of(cls, result: OpenLoopResult) -> Tally:
        counts = result.all_status_counts
        return cls(
            latencies_s=list(result.latencies_s),
            refusals=counts.get(429, 0) + counts.get(503, 0),
            refusals_without_retry_after=result.refusals_without_retry_after,
            other={s: n for s, n in counts.items() if s not in (200, 429, 503)},
            other_bodies={
                s: b.decode(errors="replace") for s, b in result.unexpected_bodies.items()
            },
            unanswered=result.no_answer_total,
        )

    def answer(self, status: int, seconds: float, retry_after: bool) -> None:
        if status == 200:
            self.latencies_s.append(seconds)
        elif status in (429, 503):
            self.refusals += 1
            self.refusals_without_retry_after += not retry_after
        else:
            self.other[status] = self.other.get(status, 0) + 1

    def figures(self) -> dict[str, object]:
        ordered = sorted(self.latencies_s)

        def p(q: float) -> float | None:
            if not ordered:
                return None
            return round(1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1)

        return {
            "answered": len(ordered),
            "p50_ms": p(0.5),
            "p99_ms": p(0.99),
            "refused": self.refusals,
            "refused_without_retry_after": self.refusals_without_retry_after,
            "other_statuses": {str(k): v for k, v in sorted(self.other.items())},
            "other_bodies": {str(k): v for k, v in sorted(self.other_bodies.items())},
            "unanswered": self.unanswered,
            "left_on_purpose": self.left,
        }


@dataclass(frozen=True)
class OpenStream:
    name: str
    path: str
    bodies: list[bytes]
    per_s: float
    priority: str

    async def minute(self, server: Server, seconds: float) -> Tally:
        result = await run_open_loop(
            "127.0.0.1",
            server.port,
            self.path,
            self.bodies,
            self.per_s,
            seconds,
            warmup_s=0,
            headers={"X-Priority": self.priority},
            request_timeout_s=REQUEST_TIMEOUT_S,
        )
        return Tally.of(result)


@dataclass(frozen=True)
class GenerationClients:
    """`clients` closed loops of short chat completions, streamed or whole; with `leave`,
    each reads the first event of a stream and closes the connection."""

    name: str
    model: str
    clients: int
    stream: bool
    priority: str
    leave: bool = False

    async def minute(self, server: Server, seconds: float) -> Tally:
        tally = Tally()
        until = time.monotonic() + seconds
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
            await asyncio.gather(
                *(self._loop(client, server, tally, until, i) for i in range(self.clients))
            )
        return tally

    async def _loop(
        self, client: httpx.AsyncClient, server: Server, tally: Tally, until: float, i: int
    ) -> None:
        n = 0
        while time.monotonic() < until:
            n += 1
            body = {
                "model": self.model,
                "messages": [{"role": "user", "content": f"soak {i} {n}: tell me more"}],
                "max_tokens": 16,
                "stream": self.stream,
            }
            headers = {**JSON, "X-Priority": self.priority}
            sent = time.monotonic()
            try:
                status, retry = await self._one(client, server, body, headers, tally)
            except httpx.HTTPError:
                tally.unanswered += 1
                await asyncio.sleep(0.5)
                continue
            if status is not None:
                tally.answer(status, time.monotonic() - sent, retry)
                if status != 200:
                    await asyncio.sleep(1)  # as told by Retry-After, at least

    async def _one(
        self,
        client: httpx.AsyncClient,
        server: Server,
        body: dict,
        headers: dict[str, str],
        tally: Tally,
    ) -> tuple[int | None, bool]:
        url = f"{server.url}/v1/chat/completions"
        if not self.stream:
            answer = await client.post(url, content=orjson.dumps(body), headers=headers)
            return answer.status_code, "retry-after" in answer.headers
        async with client.stream("POST", url, content=orjson.dumps(body), headers=headers) as r:
            if r.status_code != 200:
                await r.aread()
                return r.status_code, "retry-after" in r.headers
            async for chunk in r.aiter_text():
                if self.leave:
                    tally.left += 1
                    return None, False  # the context closes the connection mid-stream
                if "[DONE]" in chunk:
                    break
            return 200, False


@dataclass(frozen=True)
class LeavingEmbeds:
    """Embedding clients that give up after `patience_s`, answered or not."""

    name: str
    bodies: list[bytes]
    per_s: float
    patience_s: float = 0.02

    async def minute(self, server: Server, seconds: float) -> Tally:
        tally = Tally()
        tasks: list[asyncio.Task[None]] = []
        async with httpx.AsyncClient(timeout=self.patience_s) as client:
            for k in range(int(seconds * self.per_s)):
                body = self.bodies[k % len(self.bodies)]
                tasks.append(asyncio.create_task(self._one(client, server, body, tally)))
                await asyncio.sleep(1 / self.per_s)
            await asyncio.gather(*tasks)
        return tally

    async def _one(
        self, client: httpx.AsyncClient, server: Server, body: bytes, tally: Tally
    ) -> None:
        sent = time.monotonic()
        try:
            answer = await client.post(f"{server.url}/v1/embeddings", content=body, headers=JSON)
        except httpx.TimeoutException:
            tally.left += 1
            return
        except httpx.HTTPError:
            tally.unanswered += 1
            return
        tally.answer(answer.status_code, time.monotonic() - sent, "retry-after" in answer.headers)
