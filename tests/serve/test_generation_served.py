"""Generation through the real app: the demo Llama served by the continuous engine, real
HTTP (HAProxy + direct ingress, the default throughput mode), the official openai client."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI, OpenAI

from bench.server import Server, descendants, load_config
from deployments.backends.generation.causal_lm import CausalLM, resolve_lm_source
from deployments.backends.generation.sampling import SamplingParams
from tests.serve.conftest import ADMIN_KEY, AUTH, STATIC_LLM

MODEL = "tiny-llama-demo"
ROOT = Path(__file__).resolve().parents[2]


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


def test_the_replica_reports_its_device_and_precision(server: Server) -> None:
    # No GPU claimed: `dtype: auto` is float32 on the CPU.
    stats = replica_stats(server)
    assert {"device": "cpu", "dtype": "float32"}.items() <= stats.items()
    # The default app sets both sizes, so neither came from a memory budget.
    configured = "kv_cache_tokens as configured; max_num_seqs as configured"
    assert stats["kv_cache"]["source"] == configured
    assert stats["kv_cache"]["max_num_seqs"] == stats["max_num_seqs"]


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
    # The demo model makes 500 tokens in under a second when the machine is idle, so on a
    # loaded one a sequence can end before its client's close reaches the replica: that is
    # a finish, not a failed cancel. Each try ends one way or the other and leaves nothing
    # running; at least one of three must be a cancel.
    body = {"model": MODEL, "prompt": "go on", "max_tokens": 500, "stream": True}
    ends = []
    for _ in range(3):
        before = replica_stats(server)
        with httpx.stream(
            "POST", f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=30
        ) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
        # The connection is closed: the sequence must go, long before 500 tokens are made.
        deadline = time.monotonic() + 10
        stats = replica_stats(server)
        while time.monotonic() < deadline and (
            stats["running_sequences"] or stats["slots"]["running"]
        ):
            time.sleep(0.05)
            stats = replica_stats(server)
        cancelled = stats["cancelled_sequences"] - before["cancelled_sequences"]
        finished = stats["finished_sequences"] - before["finished_sequences"]
        assert (cancelled, finished) in ((1, 0), (0, 1)), stats
        assert stats["running_sequences"] == 0 and stats["slots"]["running"] == 0, stats
        ends.append("cancelled" if cancelled else "finished")
        if cancelled:
            # Ended by the ingress's stop note, not by Serve cancelling the call (which
            # leaks in gRPC on both sides: calls/stream_reads.py).
            assert stats["stopped_by_note"] - before["stopped_by_note"] == 1, stats
            break
    assert ends[-1] == "cancelled", ends


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
    # Serve's @serve.batch streaming path (deployments/replicas/generation/static_engine.py) end
    # to end: both forms give the backend's greedy tokens, their count and the finish reason.
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


HOSTILE = [
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": 1e-39}),
    ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": 5e-324}),
    ("completions", {"prompt": "the city", "top_p": 1e-300}),
    ("completions", {"prompt": "the city", "temperature": 1e-300, "top_p": 5e-324}),
    ("completions", {"prompt": "the city", "temperature": 2, "top_p": 1e-300, "seed": 0}),
    ("completions", {"prompt": "the city", "temperature": 1, "seed": 2**64 - 1}),
    ("completions", {"prompt": "the city", "temperature": 1, "seed": 2**64}),
    ("completions", {"prompt": "the city", "temperature": 1, "seed": -1}),
    ("completions", {"prompt": "the city", "temperature": 1, "seed": 2**63}),
    ("completions", {"prompt": ""}),
    ("completions", {"prompt": "   "}),
    ("completions", {"prompt": "", "stream": True}),
    ("completions", {"prompt": [""]}),
    ("chat/completions", {"messages": [{"role": "user", "content": ""}]}),
    ("completions", {"prompt": "x", "temperature": 1e-39, "stream": True}),
    ("completions", {"prompt": "x", "model": STATIC_LLM, "temperature": 1e-39}),
    ("completions", {"prompt": "", "model": STATIC_LLM}),
    ("completions", {"prompt": "x", "model": STATIC_LLM, "top_p": 1e-300, "seed": 2**64 - 1}),
]


def gcs_address(server: Server) -> str:
    """The address of the server's own Ray, as its processes were told it."""
    for pid in descendants(server.process.pid):
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for arg in args:
            if arg.startswith(b"--gcs-address="):
                return arg.split(b"=", 1)[1].decode()
    raise AssertionError("no process of the server names its Ray's GCS address")


def _expected_greedy(prompt: str, max_tokens: int) -> str:
    lm = CausalLM(resolve_lm_source(_source()))
    return lm.decode(lm.generate([lm.prompt_ids(prompt)], [max_tokens], [SamplingParams(0.0)])[0])


async def _stream_text(http: httpx.AsyncClient, url: str, body: dict, started: asyncio.Event):
    """The text of a streamed completion, and the error event that ended it, if any."""
    parts: list[str] = []
    async with http.stream("POST", url, json={**body, "stream": True}, headers=AUTH) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line.removeprefix("data: "))
            if "error" in event:
                return "".join(parts), event["error"]
            parts.append(event["choices"][0]["text"])
            started.set()
    return "".join(parts), None


async def test_hostile_sampling_and_empty_prompts_leave_a_concurrent_stream_intact(
    server: Server,
) -> None:
    before = replica_stats(server)
    prompt, max_tokens = "a story about the river", 400
    expected = _expected_greedy(prompt, max_tokens)
    url = f"{server.url}/v1/completions"
    long = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    async with httpx.AsyncClient(timeout=60) as http:
        started = asyncio.Event()
        stream = asyncio.create_task(_stream_text(http, url, long, started))
        await asyncio.wait_for(started.wait(), 30)

        async def hostile(route: str, body: dict) -> tuple[str, dict, int, bytes]:
            request = {"model": MODEL, "max_tokens": 16, **body}
            response = await http.post(f"{server.url}/v1/{route}", json=request, headers=AUTH)
            return route, body, response.status_code, response.content

        answers = await asyncio.gather(*(hostile(route, body) for route, body in HOSTILE))
        assert not stream.done(), "the long stream ended before the corpus was sent"
        text, error = await stream
    for route, body, status, content in answers:
        assert status < 500, (route, body, status, content)
        if status >= 400:
            error_body = json.loads(content)["error"]
            assert set(error_body) == {"message", "type", "param", "code"}
    empties = [status for _, body, status, _ in answers if body.get("prompt") in ("", "   ")]
    assert len(empties) == 4 and set(empties) == {400}
    assert error is None and text == expected  # the innocent stream, intact
    after = replica_stats(server)
    assert after["generation_thread_alive"]
    assert after["engine_restarts"] == before["engine_restarts"]  # the engine never died


async def test_an_engine_death_is_noticed_at_once_and_generation_comes_back(
    server: Server,
) -> None:
    drill = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.serve.engine_drill",
        gcs_address(server),
        "tributary",
        f"generate-{MODEL}",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
        # The server's Ray runs in token mode; a driver joins with the token that instance
        # wrote to ~/.ray/auth_token only when told to use it.
        env={**os.environ, "RAY_AUTH_MODE": "token"},
    )
    assert drill.stdin is not None and drill.stdout is not None
    try:
        line = await asyncio.wait_for(drill.stdout.readline(), 120)
        assert line.strip() == b"ready", line
        url = f"{server.url}/v1/completions"
        long = {"model": MODEL, "prompt": "a long story", "max_tokens": 500, "temperature": 0}
        async with httpx.AsyncClient(timeout=30) as http:
            started = asyncio.Event()
            stream = asyncio.create_task(_stream_text(http, url, long, started))
            await asyncio.wait_for(started.wait(), 30)
            drill.stdin.write(b"go\n")
            await drill.stdin.drain()
            health: list[tuple[float, int]] = []

            async def watch_health() -> None:
                while True:
                    response = await http.get(f"{server.url}/healthz")
                    health.append((time.monotonic(), response.status_code))
                    await asyncio.sleep(0.05)

            watching = asyncio.create_task(watch_health())
            drilled = (await asyncio.wait_for(drill.stdout.readline(), 30)).split()
            assert drilled[0] == b"drilled" and drilled[2] == b"True", drilled
            died = float(drilled[1])
            _, error = await asyncio.wait_for(stream, 5)
            cut = time.monotonic() - died
            # The stream in flight is cut at once with an error event, not left to hang.
            assert error is not None and set(error) == {"message", "type", "param", "code"}
            assert cut < 2, f"the stream ended {cut:.2f} s after the engine died"
            body = {"model": MODEL, "prompt": "the city", "max_tokens": 8, "temperature": 0}
            for _ in range(50):
                response = await http.post(url, json=body, headers=AUTH)
                if response.status_code == 200:
                    break
                assert response.status_code == 503 and "Retry-After" in response.headers
                await asyncio.sleep(0.1)
            back = time.monotonic() - died
            assert response.status_code == 200, response.text
            # /healthz follows within a poll or two: each asks Serve and the engines, so a
            # sample taken while the engine restarted can be the last one seen so far.
            for _ in range(60):
                if health and health[-1][1] == 200:
                    break
                await asyncio.sleep(0.05)
            watching.cancel()
    finally:
        if drill.returncode is None:
            drill.kill()
        await drill.wait()
    down = [t - died for t, status in health if status == 503]
    print(
        f"\nengine death: stream cut after {cut:.2f} s, generation back after {back:.2f} s, "
        f"/healthz 503 seen {len(down)} times (first at "
        f"{min(down) if down else float('nan'):.2f} s), last /healthz {health[-1][1]}, "
        f"the stream's error: {error['code']}"
    )
    assert back < 3, f"generation was back only {back:.2f} s after the engine died"
    # /healthz says so within 2 s (issue 12), unless the engine was back before that: the
    # watchdog restarts it in ~0.2 s, a window a 50 ms poll usually but not always sees.
    assert (down and min(down) < 2) or back < 2, f"/healthz 503 at {down}, back at {back:.2f}"
    assert health[-1][1] == 200
    stats = replica_stats(server)
    assert stats["engine_restarts"] >= 1 and stats["generation_thread_alive"]
