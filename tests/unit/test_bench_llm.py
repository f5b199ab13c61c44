"""The pure parts of the LLM benchmark: workload, Poisson arrivals, percentiles, SSE
parsing, summaries, the verdict and the plot."""

import asyncio
import itertools
import math
import statistics
import time

import pytest

from bench.llm import bench_config
from bench.llm_plot import ttft_svg
from bench.llm_render import Run, verdict
from bench.llm_workload import (
    StreamTiming,
    Summary,
    mixed_requests,
    percentile,
    poisson_arrivals,
    summarize,
)
from bench.server import load_config
from bench.sse_client import SseSplitter, classify, stream_completion


def test_mixed_requests_are_seeded_and_within_range() -> None:
    first, again = mixed_requests(200, seed=3), mixed_requests(200, seed=3)
    assert first == again and first != mixed_requests(200, seed=4)
    for r in first:
        assert 8 <= r.prompt_words <= 256 and 8 <= r.max_tokens <= 256
        assert len(r.prompt.split()) == r.prompt_words and r.prompt == r.prompt.lower()
        assert "." not in r.prompt  # punctuation would be a token of its own
    # Uniform over the range: both ends of it are reached and the mean is near the middle.
    assert statistics.mean(r.max_tokens for r in first) == pytest.approx(132, abs=15)


def test_poisson_arrivals_have_the_rate_and_exponential_gaps() -> None:
    arrivals = poisson_arrivals(10.0, 200.0, seed=1)
    assert arrivals == sorted(arrivals) and arrivals[0] > 0 and arrivals[-1] < 200
    assert len(arrivals) == pytest.approx(2000, rel=0.1)
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    # Exponential: the standard deviation equals the mean (a fixed schedule would give 0).
    assert statistics.stdev(gaps) == pytest.approx(statistics.mean(gaps), rel=0.1)
    assert poisson_arrivals(10.0, 200.0, seed=1) == arrivals
    with pytest.raises(ValueError):
        poisson_arrivals(0, 10)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99
    assert percentile(values, 100) == 100 and percentile([7.0], 99) == 7
    assert percentile([3.0, 1.0, 2.0], 50) == 2
    assert math.isnan(percentile([], 50))


def test_sse_splitter_joins_events_across_reads() -> None:
    splitter = SseSplitter()
    assert splitter.feed(b'data: {"a"') == []
    assert splitter.feed(b": 1}\n\ndata: [DONE]\r\n") == [b'{"a": 1}']
    assert splitter.feed(b"\r\n: a comment\n\n") == [b"[DONE]"]  # comment-only: no event


def test_classify_events() -> None:
    token = classify(b'{"choices": [{"text": "x", "finish_reason": null}]}')
    assert token.has_choice and token.completion_tokens is None and not token.done
    usage = classify(b'{"choices": [], "usage": {"completion_tokens": 7}}')
    assert not usage.has_choice and usage.completion_tokens == 7
    assert classify(b"[DONE]").done
    with pytest.raises(RuntimeError):
        classify(b'{"error": {"message": "boom"}}')


def test_summary_counts_refusals_and_per_token_latency() -> None:
    good = StreamTiming(200, ttft_s=0.1, e2e_s=1.1, completion_tokens=11)
    one_token = StreamTiming(200, ttft_s=0.2, e2e_s=0.2, completion_tokens=1)
    assert good.per_token_s == pytest.approx(0.1) and math.isnan(one_token.per_token_s)
    broken = StreamTiming(200, ttft_s=0.1)  # no [DONE]
    summary = summarize([good, one_token, StreamTiming(429), StreamTiming(0), broken], 2.0)
    assert (summary.requests, summary.ok, summary.refused, summary.failed) == (5, 2, 1, 2)
    assert summary.output_tokens_per_s == 6.0
    assert summary.ttft_p99_ms == pytest.approx(200) and summary.per_token_p50_ms == 100


def _summary(tokens_per_s: float, ttft_p99_ms: float) -> Summary:
    return Summary(10, 10, 0, 0, tokens_per_s, 1, ttft_p99_ms, 1, 1, 1)


def test_verdict_looks_only_near_capacity() -> None:
    loops = [
        Run("continuous", 1.0, _summary(100, 900)),  # light load: not judged
        Run("static", 1.0, _summary(100, 1000)),
        Run("continuous", 4.0, _summary(399, 100)),
        Run("static", 4.0, _summary(400, 1000)),
        Run("continuous", 5.0, _summary(500, 600)),
        Run("static", 5.0, _summary(450, 1000)),
    ]
    checks = verdict(loops, capacity=4.2)
    assert [(rate, ok) for rate, _, _, ok in checks] == [(4.0, True), (5.0, False)]


def test_bench_config_serves_one_model_with_both_engines() -> None:
    args = bench_config(load_config())["applications"][0]["args"]
    engines = {m["name"]: m["engine"] for m in args["generation_models"]}
    assert engines == {"llm-continuous": "continuous", "llm-static": "static"}
    assert args["rerank_models"] == [] and len(args["embedding_models"]) == 1
    assert args["embedding_models"][0]["deployment"]["ray_actor_options"]["num_cpus"] == 0


def test_plot_has_a_line_per_engine() -> None:
    svg = ttft_svg("t", {"continuous": [(1, 50), (2, 80)], "static": [(1, 900), (2, 5000)]})
    assert svg.startswith("<svg") and svg.count("<polyline") == 2 and "static" in svg


async def test_stream_completion_times_a_chunked_event_stream() -> None:
    events = [
        b'data: {"choices": [{"text": "a"}]}\n\n',
        b'data: {"choices": [{"text": "b"}]}\n\ndata: {"choices": [], "usage": '
        b'{"completion_tokens": 2}}\n\n',
        b"data: [DONE]\n\n",
    ]

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for event in events:
            writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        timing = await stream_completion(
            "127.0.0.1", port, b"POST / HTTP/1.1\r\n\r\n", time.perf_counter()
        )
    assert timing.ok and timing.completion_tokens == 2 and len(timing.chunk_times_s) == 2
    assert 0 <= timing.ttft_s < timing.e2e_s
