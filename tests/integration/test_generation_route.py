"""The generation routes over the ingress's HTTP app, with a fake streaming handle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from deployments.core.protocol import GenerationChunk, Rejection
from deployments.http.server import HttpIngress as Ingress
from tests.integration.conftest import CONFIG, FakeEmbedder

MODEL = "fake-llm"


class _Stream:
    def __init__(self, events: list[Any]) -> None:
        self._events = iter(events)
        self.cancelled = False
        self.ended = False

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        await asyncio.sleep(0)
        try:
            return next(self._events)
        except StopIteration:
            self.ended = True
            raise StopAsyncIteration from None

    def cancel(self) -> None:
        self.cancelled = True


class _StopNotes:
    """`handle.stop_sequence.remote(key)`: recorded; the run it names is found."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys

    def remote(self, key: str) -> Any:
        self.keys.append(key)
        return asyncio.ensure_future(asyncio.sleep(0, True))


class FakeGenerator:
    """`handle.options(stream=True).generate.remote(...)` and `handle.info.remote()`."""

    def __init__(self) -> None:
        self.events: list[Any] = [
            GenerationChunk("hello", 3, 1),
            GenerationChunk(" world", 3, 2, "length"),
        ]
        self.calls: list[tuple[str, Any, float | None]] = []
        self.streams: list[_Stream] = []
        self.stop_keys: list[str] = []
        self.generate = self
        self.info = self
        self.stop_sequence = _StopNotes(self.stop_keys)

    def options(self, stream: bool) -> FakeGenerator:
        assert stream
        return self

    def remote(self, *args: Any) -> Any:
        if not args:  # info
            return asyncio.ensure_future(asyncio.sleep(0, {"running_sequences": 0}))
        self.calls.append(args)
        self.streams.append(_Stream(list(self.events)))
        return self.streams[-1]


def app_and_fake() -> tuple[Any, FakeGenerator]:
    config = {**CONFIG, "generation_models": [{"name": MODEL, "source": "demo:tiny-llama"}]}
    fake = FakeGenerator()

    async def ready() -> None:
        return None

    ingress = Ingress(
        config,
        embedders={"fake-embedder": FakeEmbedder()},
        readiness=ready,
        generators={MODEL: fake},
    )
    return ingress.__serve_build_asgi_app__(), fake


def client_of(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://ingress")


async def test_chat_completion_whole() -> None:
    app, fake = app_and_fake()
    async with client_of(app) as client:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    answer = response.json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "hello world"}
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    priority, job, _, _ = fake.calls[0]
    assert priority == "normal" and job.messages == [{"role": "user", "content": "hi"}]


async def test_stream_is_openai_sse_with_usage_and_done() -> None:
    app, fake = app_and_fake()
    async with client_of(app) as client:
        body = {
            "model": MODEL,
            "prompt": "hi",
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        response = await client.post("/v1/completions", json=body, headers={"X-Priority": "batch"})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks[:2]] == ["hello", " world"]
    assert chunks[1]["choices"][0]["finish_reason"] == "length"
    assert chunks[2]["choices"] == [] and chunks[2]["usage"]["completion_tokens"] == 2
    assert fake.calls[0][0] == "batch"
    await asyncio.sleep(0.01)  # the stream is read to its end in the background
    # A stream that ended as it should is neither cancelled nor the subject of a stop note.
    assert fake.streams[0].ended and not fake.streams[0].cancelled and not fake.stop_keys


async def test_rejections_become_http_errors() -> None:
    app, fake = app_and_fake()
    fake.events = [Rejection(504, "No first token", code="deadline_exceeded")]
    async with client_of(app) as client:
        late = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
        fake.events = [Rejection(429, "full", code="queue_full", retry_after_s=1)]
        full = await client.post("/v1/completions", json={"model": MODEL, "prompt": "x"})
        over = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 9999}
        )
    assert late.status_code == 504 and late.json()["error"]["code"] == "deadline_exceeded"
    assert full.status_code == 429 and full.headers["retry-after"] == "1"
    assert over.status_code == 400 and "at most 512" in over.json()["error"]["message"]
    assert len(fake.calls) == 2  # the over-limit request never reached the model


async def test_models_lists_generation_task() -> None:
    app, _ = app_and_fake()
    async with client_of(app) as client:
        models = (await client.get("/v1/models")).json()["data"]
    assert {m["id"]: m["task"] for m in models}[MODEL] == "generation"
