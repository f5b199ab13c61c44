"""The generation result cache with the real demo LLM: the replica class itself (its
continuous engine, chat template and tokenizer) in this process behind a handle-shaped
adapter, the real ingress and HTTP app in front. A repeated greedy request is a hit with
the model's own text, a sampled one is computed every time, and a streamed request hits
the entry a whole answer stored (and the other way round)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest

from deployments.core.protocol import GenerationChunk, GenerationJob
from deployments.http.server import HttpIngress as Ingress
from deployments.replicas.generation.generator import Generator
from tests.integration.conftest import CONFIG, FakeEmbedder

MODEL = "tiny-llama-cached"

# One event loop for the module: the replica's engine and watchdog outlive a test.
pytestmark = pytest.mark.asyncio(loop_scope="module")


class LocalHandle:
    """`handle.options(stream=True).generate.remote(...)` onto a replica in this process."""

    def __init__(self, replica: Generator) -> None:
        self.replica = replica
        self.calls = 0
        self.generate = self

    def options(self, stream: bool) -> LocalHandle:
        assert stream
        return self

    def remote(self, *args: Any) -> LocalStream:
        self.calls += 1
        return LocalStream(self.replica.generate(*args))


class LocalStream:
    def __init__(self, events: AsyncIterator[Any]) -> None:
        self._events = events

    def __aiter__(self) -> LocalStream:
        return self

    async def __anext__(self) -> Any:
        return await self._events.__anext__()

    def cancel(self) -> None:
        return None  # every stream here is read to its end


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Generator]:
    cache_dir = tmp_path_factory.mktemp("llm")
    generator = Generator(
        {
            "name": MODEL,
            "source": "demo:tiny-llama",
            "cache_dir": str(cache_dir),
            "torch_threads": 1,
            "max_num_seqs": 4,
            "kv_cache_tokens": 2048,
        }
    )
    yield generator
    generator.engine.stop()


@pytest.fixture(scope="module")
def handle(replica: Generator) -> LocalHandle:
    return LocalHandle(replica)


@pytest.fixture(scope="module")
def app(handle: LocalHandle, replica: Generator) -> Any:
    async def ready() -> None:
        return None

    config = {
        **CONFIG,
        "generation_models": [{"name": MODEL, "source": "demo:tiny-llama"}],
        "cache": {"enabled": True, "generation": True},
    }
    ingress = Ingress(
        config,
        embedders={"fake-embedder": FakeEmbedder()},
        generators={MODEL: handle},
        readiness=ready,
    )
    return ingress.__serve_build_asgi_app__()


async def post(app: Any, path: str, body: dict) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        response = await client.post(path, json={"model": MODEL, **body}, timeout=60)
    assert response.status_code == 200, response.text
    return response


def streamed(response: httpx.Response) -> tuple[str, list[dict]]:
    events = [e.removeprefix("data: ") for e in response.text.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"]), chunks


async def fresh_text(replica: Generator, prompt: str, max_tokens: int) -> str:
    """What the model itself answers, past the ingress and its cache."""
    job = GenerationJob(request_id="fresh", max_tokens=max_tokens, prompt=prompt, temperature=0)
    events = [e async for e in replica.generate("normal", job, 30.0)]
    assert all(isinstance(e, GenerationChunk) for e in events), events
    return "".join(e.text for e in events)


async def test_a_repeated_greedy_chat_hits_with_the_models_text(
    app: Any, handle: LocalHandle
) -> None:
    body = {
        "messages": [{"role": "user", "content": "the history of the old bridge"}],
        "max_tokens": 12,
        "temperature": 0,
    }
    before = handle.calls
    first = (await post(app, "/v1/chat/completions", body)).json()
    second = (await post(app, "/v1/chat/completions", body)).json()
    assert handle.calls - before == 1
    assert first["usage"]["cached_inputs"] == 0 and second["usage"]["cached_inputs"] == 1
    text = first["choices"][0]["message"]["content"]
    assert text and second["choices"][0]["message"]["content"] == text
    assert second["choices"][0]["finish_reason"] == first["choices"][0]["finish_reason"]
    assert second["usage"]["completion_tokens"] == first["usage"]["completion_tokens"]


async def test_a_sampled_request_is_computed_every_time(app: Any, handle: LocalHandle) -> None:
    body = {"prompt": "the river runs", "max_tokens": 6, "temperature": 0.7}
    before = handle.calls
    for _ in range(2):
        answer = (await post(app, "/v1/completions", body)).json()
        assert "cached_inputs" not in answer["usage"]
    assert handle.calls - before == 2


async def test_streamed_and_whole_answers_share_one_entry(
    app: Any, handle: LocalHandle, replica: Generator
) -> None:
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    whole_first = {"prompt": "the city by the sea", "max_tokens": 10, "temperature": 0}
    stream_first = {"prompt": "a mill on the river", "max_tokens": 10, "temperature": 0}
    before = handle.calls
    whole = (await post(app, "/v1/completions", whole_first)).json()
    hit_text, hit = streamed(await post(app, "/v1/completions", {**whole_first, **usage}))
    assert hit_text == whole["choices"][0]["text"]
    assert hit[-1]["usage"]["cached_inputs"] == 1
    assert hit[-2]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    # A streamed miss is stored once it finished; the whole answer then hits.
    live_text, live = streamed(await post(app, "/v1/completions", {**stream_first, **usage}))
    again = (await post(app, "/v1/completions", stream_first)).json()
    assert live[-1]["usage"]["cached_inputs"] == 0 and again["usage"]["cached_inputs"] == 1
    assert again["choices"][0]["text"] == live_text
    assert handle.calls - before == 2
    # The entry is the model's own greedy answer.
    assert live_text == await fresh_text(replica, "a mill on the river", 10)
