"""The generation result cache over the ingress's HTTP app, with fake streaming handles:
greedy completions hit (whole and streamed), sampled ones never, a version misses the
other's entries, a broken stream is not stored, and the hits show in usage, /v1/stats and
the metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import orjson

from deployments.core.metrics.metrics import CACHE_LOOKUPS, MemoryRecorder, TributaryMetrics
from deployments.core.protocol import GenerationChunk
from deployments.http.server import HttpIngress as Ingress
from tests.integration.conftest import CONFIG, FakeEmbedder
from tests.integration.test_generation_route import MODEL, FakeGenerator, client_of


class Stream:
    """A streaming call's response: its events (an exception is raised mid-stream), each
    after `gate` opens."""

    def __init__(self, events: list[Any], gate: asyncio.Event) -> None:
        self._events: Iterator[Any] = iter(events)
        self._gate = gate
        self.cancelled = False

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Any:
        await self._gate.wait()
        try:
            event = next(self._events)
        except StopIteration:
            raise StopAsyncIteration from None
        if isinstance(event, Exception):
            raise event
        return event

    def cancel(self) -> None:
        self.cancelled = True


class Generator(FakeGenerator):
    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    def remote(self, *args: Any) -> Any:
        if not args:
            return super().remote()
        self.calls.append(args)
        self.streams.append(Stream(list(self.events), self.gate))
        return self.streams[-1]


class App:
    def __init__(self, versions: tuple[str, ...] = ("1",), **cache: object) -> None:
        models = [{"name": MODEL, "source": "demo:tiny-llama", "version": v} for v in versions]
        self.fakes = {v: Generator() for v in versions}
        self.recorder = MemoryRecorder()

        async def ready() -> None:
            return None

        handles = {f"{MODEL}@{v}" if len(versions) > 1 else MODEL: f for v, f in self.fakes.items()}
        self.ingress = ingress = Ingress(
            {
                **CONFIG,
                "generation_models": models,
                "cache": {"enabled": True, "generation": True, **cache},
            },
            embedders={"fake-embedder": FakeEmbedder()},
            generators=handles,
            readiness=ready,
            metrics=TributaryMetrics(self.recorder),
        )
        self.app = ingress.__serve_build_asgi_app__()

    @property
    def fake(self) -> Generator:
        return self.fakes["1"]

    def lookups(self, result: str) -> float:
        return sum(self.recorder.values(CACHE_LOOKUPS, model=MODEL, result=result))


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
GREEDY = {**CHAT, "temperature": 0}


def events_of(response: httpx.Response) -> list[dict]:
    events = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e]
    assert events[-1] == "[DONE]", events
    return [orjson.loads(e) for e in events[:-1]]


def streamed_text(chunks: list[dict]) -> str:
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])


async def test_a_repeated_greedy_chat_is_answered_from_the_cache() -> None:
    app = App()
    async with client_of(app.app) as client:
        first = (await client.post("/v1/chat/completions", json=GREEDY)).json()
        second = (await client.post("/v1/chat/completions", json=GREEDY)).json()
        stats = (await client.get("/v1/stats")).json()["models"][MODEL]["cache"]
    assert len(app.fake.calls) == 1
    assert first["usage"]["cached_inputs"] == 0 and second["usage"]["cached_inputs"] == 1
    assert second["choices"] == first["choices"]
    assert second["choices"][0]["message"]["content"] == "hello world"
    # The stored usage and finish reason; a fresh id.
    assert second["usage"]["completion_tokens"] == 2 and second["id"] != first["id"]
    assert (app.lookups("hit"), app.lookups("miss")) == (1, 1)
    assert stats["hits"] == 1 and stats["misses"] == 1 and stats["entries"] == 1


async def test_a_sampled_request_is_never_cached() -> None:
    app = App()
    async with client_of(app.app) as client:
        for _ in range(2):
            body = {**CHAT, "temperature": 0.7, "seed": 1}
            answer = (await client.post("/v1/chat/completions", json=body)).json()
            assert "cached_inputs" not in answer["usage"]
        # The default temperature is 1: sampled.
        await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
    assert len(app.fake.calls) == 3
    assert app.lookups("hit") + app.lookups("miss") == 0


async def test_a_streamed_request_hits_and_a_streamed_miss_is_stored() -> None:
    app = App()
    stream = {**GREEDY, "stream": True, "stream_options": {"include_usage": True}}
    async with client_of(app.app) as client:
        live = events_of(await client.post("/v1/chat/completions", json=stream))
        whole = (await client.post("/v1/chat/completions", json=GREEDY)).json()
        replayed = events_of(await client.post("/v1/chat/completions", json=stream))
    assert len(app.fake.calls) == 1  # the streamed miss was stored, then hit twice
    assert live[-1]["usage"]["cached_inputs"] == 0 and whole["usage"]["cached_inputs"] == 1
    assert streamed_text(live) == streamed_text(replayed) == "hello world"
    assert replayed[0]["choices"][0]["delta"]["role"] == "assistant"
    assert replayed[-2]["choices"][0]["finish_reason"] == "length"
    assert replayed[-1]["usage"] == {**live[-1]["usage"], "cached_inputs": 1}
    assert {c["object"] for c in replayed} == {"chat.completion.chunk"}


async def test_a_stream_that_broke_is_not_stored() -> None:
    app = App()
    app.fake.events = [GenerationChunk("hel", 3, 1), RuntimeError("engine died")]
    body = {"model": MODEL, "prompt": "hi", "temperature": 0, "stream": True}
    async with client_of(app.app) as client:
        broken = await client.post("/v1/completions", json=body)
        assert '"error"' in broken.text and "[DONE]" not in broken.text
        app.fake.events = [GenerationChunk("hello", 3, 1, "stop")]
        fresh = await client.post("/v1/completions", json={**body, "stream": False})
    assert len(app.fake.calls) == 2
    assert fresh.json()["usage"]["cached_inputs"] == 0


async def test_identical_greedy_requests_in_flight_are_computed_once() -> None:
    app = App()
    app.fake.gate.clear()
    async with client_of(app.app) as client:
        requests = [
            asyncio.create_task(client.post("/v1/chat/completions", json=GREEDY)) for _ in range(3)
        ]
        await asyncio.sleep(0.05)
        app.fake.gate.set()
        answers = [(await r).json() for r in requests]
    assert len(app.fake.calls) == 1
    assert {a["choices"][0]["message"]["content"] for a in answers} == {"hello world"}


async def test_a_version_never_sees_another_versions_entries() -> None:
    app = App(versions=("1", "2"))
    app.fakes["2"].events = [GenerationChunk("hello there", 3, 2, "length")]
    async with client_of(app.app) as client:

        async def ask(version: str) -> dict:
            body = {**GREEDY, "model": f"{MODEL}@{version}"}
            return (await client.post("/v1/chat/completions", json=body)).json()

        one, again, two = await ask("1"), await ask("1"), await ask("2")
    assert again["usage"]["cached_inputs"] == 1
    assert two["usage"]["cached_inputs"] == 0
    assert two["choices"][0]["message"]["content"] == "hello there"
    assert one["choices"][0]["message"]["content"] == "hello world"
    assert (len(app.fakes["1"].calls), len(app.fakes["2"].calls)) == (1, 1)
