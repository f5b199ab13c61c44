"""Generation through the real app: the demo Llama served by the continuous engine, real
HTTP (HAProxy + direct ingress, the default throughput mode), the official openai client."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from bench.server import Server, load_config
from deployments.backends.causal_lm import CausalLM, resolve_lm_source
from deployments.backends.sampling import SamplingParams
from tests.serve.conftest import ADMIN_KEY, AUTH, STATIC_LLM

MODEL = "tiny-llama-demo"


def _source() -> str:
    args = load_config()["applications"][0]["args"]
    return next(m["source"] for m in args["generation_models"] if m["name"] == MODEL)


@pytest.fixture(scope="module")
def client(server: Server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key=ADMIN_KEY)


def replica_stats(server: Server) -> dict:
    stats = httpx.get(f"{server.url}/v1/stats", headers=AUTH, timeout=10).json()
    return stats["models"][MODEL]["replica"]


def test_models_lists_the_generation_model(server: Server) -> None:
    models = httpx.get(f"{server.url}/v1/models", headers=AUTH, timeout=10).json()["data"]
    assert {"id": MODEL, "task": "generation"}.items() <= next(
        m for m in models if m["id"] == MODEL
    ).items()


def test_chat_completion_with_the_openai_client(client: OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "tell me about the river"}],
        max_tokens=9,
        temperature=0.7,
        seed=1,
    )
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("length", "stop")
    assert reply.usage.completion_tokens <= 9 and reply.usage.prompt_tokens > 0
    if choice.finish_reason == "length":
        assert reply.usage.completion_tokens == 9


def test_streamed_completion_ends_with_usage_and_matches_the_whole_answer(client: OpenAI) -> None:
    common = {"model": MODEL, "prompt": "the city by the sea", "max_tokens": 12, "temperature": 0}
    whole = client.completions.create(**common)
    chunks = list(
        client.completions.create(**common, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason


def test_greedy_is_deterministic_and_equals_the_backend_generate(client: OpenAI) -> None:
    messages = [{"role": "user", "content": "the history of the old bridge"}]
    answers = [
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
        for _ in range(2)
    ]
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
    lm = CausalLM(resolve_lm_source(_source()))
    prompt = lm.chat_ids(messages)
    expected = lm.generate([prompt], [20], [SamplingParams(0.0)])[0]
    assert answers[0].usage.completion_tokens == len(expected)
    assert answers[0].choices[0].message.content == lm.decode(expected)


async def test_sixteen_concurrent_streams_complete_with_their_token_counts(server: Server) -> None:
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=ADMIN_KEY)
    lengths = [8 + 7 * i for i in range(16)]

    async def one(max_tokens: int) -> tuple[int, int, str]:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"count {max_tokens}"}],
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        pieces, reason, used = 0, "", 0
        async for chunk in stream:
            if chunk.choices:
                pieces += bool(chunk.choices[0].delta.content)
                reason = chunk.choices[0].finish_reason or reason
            if chunk.usage is not None:
                used = chunk.usage.completion_tokens
        return used, pieces, reason

    results = await asyncio.gather(*(one(n) for n in lengths))
    await client.close()
    for asked, (used, pieces, reason) in zip(lengths, results, strict=True):
        assert pieces >= 1 and used >= 1
        assert used == asked if reason == "length" else (reason == "stop" and used < asked)


async def test_a_short_request_finishes_before_a_long_one_started_first(server: Server) -> None:
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=ADMIN_KEY)
    finished: list[str] = []

    async def run(name: str, max_tokens: int) -> None:
        await client.completions.create(
            model=MODEL, prompt="a story", max_tokens=max_tokens, temperature=0
        )
        finished.append(name)

    long = asyncio.create_task(run("long", 500))
    await asyncio.sleep(0.3)  # the long one is generating
    await run("short", 4)
    await long
    await client.close()
    assert finished == ["short", "long"]


def test_disconnecting_a_stream_cancels_its_sequence(server: Server) -> None:
    before = replica_stats(server)["cancelled_sequences"]
    body = {"model": MODEL, "prompt": "go on", "max_tokens": 500, "stream": True}
    with httpx.stream(
        "POST", f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=30
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    # The connection is closed: the sequence must go, long before 500 tokens are made.
    deadline = time.monotonic() + 10
    stats = replica_stats(server)
    while time.monotonic() < deadline and stats["cancelled_sequences"] == before:
        time.sleep(0.2)
        stats = replica_stats(server)
    assert stats["cancelled_sequences"] == before + 1
    assert stats["running_sequences"] == 0 and stats["slots"]["running"] == 0


@pytest.mark.parametrize(
    ("route", "body", "status", "needle"),
    [
        ("chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n=1"),
        ("completions", {"prompt": "x", "max_tokens": 100000}, 400, "at most 512"),
        ("completions", {"prompt": "x " * 1000, "max_tokens": 100}, 400, "context window is 1024"),
        ("completions", {"prompt": "x", "logit_bias": {}}, 400, "logit_bias"),
        ("chat/completions", {"messages": []}, 400, "messages"),
        ("completions", {"prompt": "x", "temperature": 9}, 400, "temperature"),
    ],
)
def test_bad_inputs_get_a_clear_4xx(
    server: Server, route: str, body: dict, status: int, needle: str
) -> None:
    response = httpx.post(
        f"{server.url}/v1/{route}", json={"model": MODEL, **body}, headers=AUTH, timeout=30
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert needle in error["message"] and set(error) == {"message", "type", "param", "code"}


def test_unknown_generation_model_is_404(server: Server) -> None:
    body = {"model": "nope", "prompt": "x"}
    response = httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=30)
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def test_static_engine_answers_whole_and_streamed_like_the_backend(client: OpenAI) -> None:
    # Serve's @serve.batch streaming path (deployments/static_engine.py) end to end: both
    # forms give the backend's greedy tokens, their count and the finish reason.
    prompt = "the river runs past the old mill"
    lm = CausalLM(resolve_lm_source(_source()))
    expected = lm.generate([lm.prompt_ids(prompt)], [10], [SamplingParams(0.0)])[0]
    common = {"model": STATIC_LLM, "prompt": prompt, "max_tokens": 10, "temperature": 0}
    whole = client.completions.create(**common)
    assert whole.usage.completion_tokens == len(expected)
    assert whole.choices[0].text == lm.decode(expected)
    assert whole.choices[0].finish_reason == ("length" if len(expected) == 10 else "stop")
    chunks = list(
        client.completions.create(**common, stream=True, stream_options={"include_usage": True})
    )
    assert chunks[-1].usage.completion_tokens == len(expected)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason


async def test_static_engine_batches_concurrent_chats_each_to_its_own_length(
    server: Server,
) -> None:
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=ADMIN_KEY)
    lengths = [3, 9, 17, 30]  # one batch: each row must stop at its own max_tokens

    async def one(max_tokens: int) -> tuple[int, str | None]:
        reply = await client.chat.completions.create(
            model=STATIC_LLM,
            messages=[{"role": "user", "content": f"count to {max_tokens}"}],
            max_tokens=max_tokens,
            temperature=0,
        )
        return reply.usage.completion_tokens, reply.choices[0].finish_reason

    results = await asyncio.gather(*(one(n) for n in lengths))
    await client.close()
    for asked, (used, reason) in zip(lengths, results, strict=True):
        assert used == asked if reason == "length" else (reason == "stop" and used < asked)
    async with httpx.AsyncClient(timeout=10) as http:
        stats = (await http.get(f"{server.url}/v1/stats", headers=AUTH)).json()
    replica = stats["models"][STATIC_LLM]["replica"]
    assert replica["engine"] == "static" and replica["batches"] >= 1
    assert replica["running_sequences"] == 0 and replica["slots"]["running"] == 0
