"""The pure parts of the mixed-priority benchmark: Retry-After, stats deltas, verdict, table."""

import asyncio
import math

from bench.http_response import Answer, parse_retry_after, read_response
from bench.loadgen import LoadResult
from bench.open_loop import OpenLoopResult
from bench.priority_mix import (
    MixRound,
    MixSettings,
    class_batch_sizes,
    failed_criteria,
    refused_delta,
    render,
)


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert parse_retry_after(b"3") == 3.0
    assert parse_retry_after(b" 1.5 ") == 1.5
    assert parse_retry_after(b"-4") == 0.0
    now = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT
    assert parse_retry_after(b"Tue, 14 Nov 2023 22:13:30 GMT", now=now) == 10.0
    assert parse_retry_after(b"Tue, 14 Nov 2023 22:13:00 GMT", now=now) == 0.0


def test_retry_after_absent_or_unreadable_is_none() -> None:
    for value in (None, b"", b"soon", b"nan", b"inf"):
        assert parse_retry_after(value) is None


def _response(raw: bytes) -> Answer:
    async def read() -> Answer:
        reader = asyncio.StreamReader()
        reader.feed_data(raw)
        reader.feed_eof()
        return await read_response(reader)

    return asyncio.run(read())


def test_a_response_gives_its_retry_after_header() -> None:
    raw = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 7\r\nContent-Length: 2\r\n\r\n{}"
    assert _response(raw) == (429, b"{}", True, b"7", None)
    assert _response(raw).wait_s() == 7.0
    ok = _response(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    assert ok == (200, b"", True, None, None) and ok.wait_s() is None


def test_retry_after_ms_comes_first_as_the_openai_sdk_reads_it() -> None:
    raw = (
        b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nretry-after-ms: 240\r\n"
        b"Content-Length: 2\r\n\r\n{}"
    )
    answer = _response(raw)
    assert (answer.retry_after, answer.retry_after_ms) == (b"1", b"240")
    assert answer.wait_s() == 0.24
    unreadable = raw.replace(b"240", b"soon")
    assert _response(unreadable).wait_s() == 1.0  # falls back to Retry-After


def test_class_batch_sizes_are_deltas_per_class() -> None:
    before = {"classes": {"realtime": {"batches": 10, "items": 10}, "batch": {}}}
    after = {
        "classes": {
            "realtime": {"batches": 30, "items": 50},
            "batch": {"batches": 4, "items": 100},
            "normal": {"batches": 7, "items": 7},
        }
    }
    assert class_batch_sizes(before, after) == {"realtime": 2.0, "normal": 1.0, "batch": 25.0}
    assert class_batch_sizes(after, after) == {"realtime": 0.0, "normal": 0.0, "batch": 0.0}


def test_refused_delta_keeps_only_what_changed() -> None:
    before = {"classes": {"batch": {"refused": {"shed": 2}}}}
    after = {"classes": {"batch": {"refused": {"shed": 2, "queue_full": 5}}}}
    assert refused_delta(before, after, "batch") == {"queue_full": 5}


def _open(latencies_ms: list[float], non_ok: int = 0) -> OpenLoopResult:
    return OpenLoopResult(
        requests=len(latencies_ms),
        failures=non_ok,
        texts=len(latencies_ms),
        seconds=20.0,
        latencies_s=[ms / 1000 for ms in latencies_ms],
        status_counts={200: len(latencies_ms)},
        first_error=None,
        non_ok_total=non_ok,
    )


def _round(
    alone_ms: float = 10.0, flood_ms: float = 20.0, non_ok: int = 0, batch_texts: int = 640
) -> MixRound:
    flood = LoadResult(
        requests=batch_texts // 32,
        failures=3,
        texts=batch_texts,
        seconds=20.0,
        latencies_s=[1.0],
        status_counts={200: batch_texts // 32, 429: 3},
        first_error=None,
    )
    return MixRound(
        alone=_open([alone_ms] * 100),
        flooded=_open([flood_ms] * 100, non_ok),
        flood=flood,
        batch_alone={"realtime": 1.0, "normal": 0.0, "batch": 0.0},
        batch_flooded={"realtime": 1.2, "normal": 0.0, "batch": 24.5},
        aged_turns=3,
        refused={"queue_full": 16},
    )


def test_p99_ratio_is_flood_over_alone() -> None:
    r = _round(alone_ms=10.0, flood_ms=25.0)
    assert r.p99_ratio == 2.5
    assert r.shed(429) == 3 and r.shed(503) == 0


def test_criteria_take_the_median_ratio_and_every_failure() -> None:
    assert failed_criteria([_round(), _round(), _round()]) == []
    # One round far over 2x, the median still within.
    assert failed_criteria([_round(), _round(), _round(flood_ms=500.0)]) == []
    assert "median realtime p99 ratio 2.10 > 2.0" in failed_criteria([_round(flood_ms=21.0)])
    failed = failed_criteria([_round(non_ok=1), _round(batch_texts=0)])
    assert any("1 realtime request" in f for f in failed)
    assert any("no work" in f for f in failed)


def test_no_realtime_answer_at_all_fails_the_ratio() -> None:
    r = _round()
    r.flooded = _open([], non_ok=100)
    assert math.isnan(r.p99_ratio)
    assert any("ratio" in f for f in failed_criteria([r]))


def test_render_shows_medians_rounds_and_the_verdict() -> None:
    rounds = [_round(), _round(), _round(non_ok=2)]
    text = render("2026-01-01 00:00 UTC", "make bench", MixSettings(), {}, rounds)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| round"))
    median = next(line for line in lines if line.startswith("| **median**"))
    assert header.count("|") == median.count("|")
    assert median.split(" | ")[5] == "2.00"  # the p99 ratio
    assert len([line for line in lines if line[:4] in ("| 1 ", "| 2 ", "| 3 ")]) == 3
    assert "1.2 / 24.5" in median
    assert "queue_full 16" in text
    assert "worst send lag per round (late sends count as latency): 0, 0, 0 ms" in text
    assert "FAIL: 2 realtime request(s) refused or failed" in text
