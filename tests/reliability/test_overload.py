"""Twice the measured capacity for a while (20 s in `make test`, 3 minutes in `make
reliability`, RELIABILITY_OVERLOAD_S=600 for the 10-minute run): normal-class embeddings at
2x (single texts in the full run, eight a request in the bounded one: settings.py),
batch-class ones at half the capacity beside them, and a single-text realtime trickle.

Always: only 200/429/503, a Retry-After on every refusal, an answer for every request, the
ingress's and the model replica's memory flat. And the goals of admission by predicted wait
(issue 31): admitted requests answered within their class's target, refusals at once,
goodput near capacity. `make reliability` (RELIABILITY_FULL=1) checks them as the goals
state them; the bounded form inside `make test` checks them with margins that hold on a
busy 2-core machine, still far from what an unbounded queue gives (seconds).
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import httpx
import pytest

from bench.loadgen import embedding_bodies, run_closed_loop
from bench.open_loop import OpenLoopResult, run_open_loop
from bench.overload_trace import (
    BATCH_SHARE,
    CALIBRATION_CLIENTS,
    REALTIME_PER_S,
    REQUEST_TIMEOUT_S,
    targets_ms,
)
from bench.process_cpu import cores_between, read_cpu
from bench.server import Server
from bench.texts import sentences
from deployments.core.priority import PriorityName
from tests.reliability import report
from tests.reliability.procs import find, realtime_ingress_pid, rss_mib
from tests.reliability.settings import is_full, sizes

pytestmark = pytest.mark.reliability

SIZES = sizes()
ALLOWED = {200, 429, 503}
RSS_GROWTH_LIMIT_MIB = 256  # generous: a leak under 2x load grows without bound
SETTLE_S = 5
# Unloaded, an embedding answers in tens of ms; a median over this means requests queued.
SATURATED_P50_MS = 1000


@dataclass(frozen=True)
class Goals:
    """What the run must show. The full run states the goals of issue 31; the bounded
    form looks at medians, with margins: on a machine whose other tenants take the CPU at
    random moments a one-second stall puts hundreds of admitted requests past the target
    at once, and a tail bound would fail one run in a few. Its medians still tell apart
    admission by prediction (hundreds of ms) from an unbounded queue (seconds)."""

    quantile: float  # of the admitted latencies and of the refusals' latencies
    target_factor: float  # admitted latency at `quantile` <= this x the class's target
    uncontended_factor: float | None  # normal's p99 <= this x its uncontended p99
    refusal_ms: float  # refusals' latency at `quantile`
    goodput_share: float  # texts answered within target per second >= this x capacity


MIN_REFUSALS_TIMED = 20
FULL = Goals(99, target_factor=1.0, uncontended_factor=5.0, refusal_ms=20, goodput_share=0.9)
BOUNDED = Goals(50, target_factor=2.0, uncontended_factor=None, refusal_ms=50, goodput_share=0.15)


def watched_processes(server: Server, embedder: str) -> dict[str, int]:
    stats = httpx.get(f"{server.url}/v1/stats", timeout=10).json()
    found = {"embedding replica": int(stats["models"][embedder]["replica"]["pid"])}
    kept = realtime_ingress_pid(server)
    others = [p for p in find(server, "ServeReplica:tributary:ingress") if p != kept]
    if kept is not None:
        found["ingress replica (realtime)"] = kept
    for number, pid in enumerate(others, start=1):
        found[f"ingress replica {number}"] = pid
    haproxy = find(server, "haproxy")
    if haproxy:
        found["haproxy"] = haproxy[0]
    return found


async def calls_by_replica(server: Server, embedder: str) -> dict[str, dict[str, int]]:
    """Per ingress replica HAProxy sends to (the one kept for realtime, the one for the
    rest), the calls it made to the model per class since it started."""
    seen = {}
    async with httpx.AsyncClient(timeout=30) as client:
        for label, headers in (("realtime replica", {"X-Priority": "realtime"}), ("other", {})):
            stats = (await client.get(f"{server.url}/v1/stats", headers=headers)).json()
            classes = stats["models"][embedder]["ingress"].get("classes", {})
            seen[label] = {c: int(v.get("calls", 0)) for c, v in classes.items()}
    return seen


def rss(processes: dict[str, int]) -> dict[str, float | None]:
    return {
        name: None if (m := rss_mib(pid)) is None else round(m, 1)
        for name, pid in processes.items()
    }


async def open_loop(
    server: Server, bodies: list[bytes], rate: float, priority: PriorityName
) -> OpenLoopResult:
    return await run_open_loop(
        "127.0.0.1",
        server.port,
        "/v1/embeddings",
        bodies,
        rate,
        SIZES.overload_s,
        warmup_s=0,
        headers={"X-Priority": priority},
        request_timeout_s=REQUEST_TIMEOUT_S,
    )


async def overload(
    server: Server, bodies: list[bytes], single: list[bytes], capacity: float, factor: float
) -> dict[PriorityName, OpenLoopResult]:
    normal, batch, realtime = await asyncio.gather(
        open_loop(server, bodies, factor * capacity, "normal"),
        open_loop(server, bodies, BATCH_SHARE * capacity, "batch"),
        open_loop(server, single, REALTIME_PER_S, "realtime"),
    )
    return {"normal": normal, "batch": batch, "realtime": realtime}


async def stats_during(server: Server, embedder: str, after_s: float) -> dict[str, object]:
    """What the server says of itself `after_s` into the overload: the share each key is
    refused at HAProxy, and per class the model's batches and the ingress's refusals."""
    await asyncio.sleep(after_s)
    async with httpx.AsyncClient(timeout=30) as client:
        stats = (await client.get(f"{server.url}/v1/stats")).json()
    model = stats["models"][embedder]
    return {
        "front_door_shares": stats.get("front_door_shares"),
        "held_requests": stats.get("held_requests"),
        "mean_batch_size": {c: v.get("mean_batch_size") for c, v in model["classes"].items()},
        "plans": model.get("replica", {}).get("plans"),
        "targets": model.get("replica", {}).get("targets"),
        "ingress_refused": {
            c: v.get("refused") for c, v in model["ingress"].get("classes", {}).items()
        },
        # Calls to the model and their jobs: how big a group leaves the ingress at once.
        "ingress_calls": {
            c: {k: v.get(k) for k in ("calls", "jobs", "items", "in_flight", "queued_items")}
            for c, v in model["ingress"].get("classes", {}).items()
        },
    }


def saturated(result: OpenLoopResult) -> bool:
    """The server could not keep up: it refused some requests or a queue built up."""
    return result.non_ok_total > 0 or result.p50_ms > SATURATED_P50_MS


def class_figures(result: OpenLoopResult, target_ms: float) -> dict[str, object]:
    return {
        "status_histogram": {str(k): v for k, v in sorted(result.all_status_counts.items())},
        "no_answer": result.no_answer_total,
        "refusals_without_retry_after": result.refusals_without_retry_after,
        "p50_ms_ok": round(result.p50_ms, 1),
        "p99_ms_ok": round(result.p(99), 1),
        "target_ms": target_ms,
        "within_target_per_s": round(result.within(target_ms / 1e3) / result.seconds, 1),
        "refusal_p50_ms": round(result.refusal_p(50), 1),
        "refusal_p99_ms": round(result.refusal_p(99), 1),
        "max_send_lag_ms": round(result.max_send_lag_ms, 1),
        "first_refusal": result.first_error,
    }


@pytest.mark.timeout(int(2 * SIZES.overload_s + SIZES.calibrate_s + 300))
async def test_twice_capacity_admits_what_it_can_serve_in_time_and_refuses_the_rest_at_once(
    server: Server, models: dict[str, list[str]]
) -> None:
    embedder = models["embedding"][0]
    goals = FULL if is_full() else BOUNDED
    targets = targets_ms()
    texts = SIZES.overload_texts
    bodies = embedding_bodies(sentences(2000), texts, embedder, 256)
    single = embedding_bodies(sentences(2000), 1, embedder, 256)
    alone = await run_closed_loop(
        "127.0.0.1", server.port, "/v1/embeddings", bodies, texts, 1, 3, warmup_s=1, progress=False
    )
    cpu_at_calibration = read_cpu(load_generator=os.getpid())
    closed = await run_closed_loop(
        "127.0.0.1",
        server.port,
        "/v1/embeddings",
        bodies,
        texts,
        CALIBRATION_CLIENTS,
        SIZES.calibrate_s,
        warmup_s=2,
        progress=False,
        # 64 clients may ask for more than the normal target allows; one that is refused
        # waits as told instead of spinning on refusals and taking the server's CPU.
        honor_retry_after=True,
    )
    cpu_at_overload = read_cpu(load_generator=os.getpid())
    capacity = closed.req_per_s
    assert capacity > 0, f"no capacity measured: {closed.summary()}"
    processes = watched_processes(server, embedder)
    before = rss(processes)
    started = time.monotonic()
    factor = 2
    during = asyncio.create_task(stats_during(server, embedder, 0.8 * SIZES.overload_s))
    results = await overload(server, bodies, single, capacity, factor)
    if not saturated(results["normal"]):
        # The calibration ran on a machine busier than it is now: the server kept up, so
        # nothing was proven. Once more, harder.
        factor = 4
        results = await overload(server, bodies, single, capacity, factor)
    seconds = time.monotonic() - started
    cpu_after_overload = read_cpu(load_generator=os.getpid())
    await asyncio.sleep(SETTLE_S)  # the queues drain and the garbage collector runs
    after = rss(processes)
    by_replica = await calls_by_replica(server, embedder)
    growth = {
        name: round(after[name] - before[name], 1)  # type: ignore[operator]
        for name in processes
        if before[name] is not None and after[name] is not None
    }
    normal, realtime = results["normal"], results["realtime"]
    # Texts answered within their class's target per second, every class, against the
    # capacity in texts: the model's time spent on batch and realtime is goodput too.
    goodput = sum(
        result.within(targets[label] / 1e3) * (1 if label == "realtime" else texts)
        for label, result in results.items()
    ) / (normal.seconds * texts)
    report.record(
        "overload_2x",
        {
            "goals": "full" if goals is FULL else "bounded",
            "texts_per_request": texts,
            "capacity_req_per_s": round(capacity, 1),
            "uncontended_p99_ms": round(alone.p(99), 1),
            "offered_req_per_s": {
                "normal": round(factor * capacity, 1),
                "batch": round(BATCH_SHARE * capacity, 1),
                "realtime": REALTIME_PER_S,
            },
            "saturated": saturated(normal),
            "overload_s": SIZES.overload_s,
            "run_seconds": round(seconds, 1),
            "goodput_share": round(goodput / capacity, 2),
            **{label: class_figures(result, targets[label]) for label, result in results.items()},
            "server_during": await during,
            # Where the cores went: the closed loop that measured capacity, then the overload.
            "cores_at_capacity": cores_between(cpu_at_calibration, cpu_at_overload),
            "cores_at_overload": cores_between(cpu_at_overload, cpu_after_overload),
            "rss_mib_before": before,
            "rss_mib_after": after,
            "rss_growth_mib": growth,
            "calls_by_ingress_replica": by_replica,
        },
    )
    assert saturated(normal), f"{factor}x the measured capacity never saturated the server"
    # The shipped config keeps one ingress replica for realtime (ingress.realtime_replica):
    # realtime went there alone, and the flood of the other classes never did.
    kept, other = by_replica["realtime replica"], by_replica["other"]
    assert kept.get("realtime", 0) > 0 and other.get("realtime", 0) == 0, by_replica
    assert kept.get("normal", 0) == kept.get("batch", 0) == 0, by_replica
    assert other.get("normal", 0) > 0, by_replica
    for label, result in results.items():
        unexpected = {s: n for s, n in result.all_status_counts.items() if s not in ALLOWED}
        assert not unexpected, f"{label}: statuses other than 200/429/503: {unexpected}"
        assert result.no_answer_total == 0, f"{label}: {result.no_answer_total} got no answer"
        assert result.refusals_without_retry_after == 0, f"{label}: a refusal without Retry-After"
    assert normal.all_status_counts.get(200, 0) > 0
    q = goals.quantile
    for label, result in (("normal", normal), ("realtime", realtime)):
        bound = goals.target_factor * targets[label]
        assert result.p(q) <= bound, f"{label}: admitted p{q:g} {result.p(q):.0f} ms > {bound} ms"
    if goals.uncontended_factor is not None:
        bound = goals.uncontended_factor * alone.p(99)
        assert normal.p(99) <= bound, f"normal p99 {normal.p(99):.0f} ms > {bound:.0f} ms (5x)"
    # A class's refusal quantile is checked once it has enough refusals to have one: realtime
    # gets 1-10 in a run, and each is timed from when it was due, so one stall of the load
    # generator (930 ms behind schedule in a CI run) made their median 201 ms while the
    # normal class's hundreds had theirs at 5 ms.
    slow = {
        label: result.refusal_p(q)
        for label, result in results.items()
        if len(result.refusal_latencies_s) >= MIN_REFUSALS_TIMED
        and result.refusal_p(q) > goals.refusal_ms
    }
    assert len(normal.refusal_latencies_s) >= MIN_REFUSALS_TIMED, "too few refusals to time"
    assert not slow, f"refusals' p{q:g} over {goals.refusal_ms} ms: {slow}"
    assert goodput >= goals.goodput_share * capacity, (
        f"goodput {goodput:.0f} req/s < {goals.goodput_share} x capacity {capacity:.0f} req/s"
    )
    grown = {name: g for name, g in growth.items() if g > RSS_GROWTH_LIMIT_MIB}
    assert not grown, f"RSS grew by more than {RSS_GROWTH_LIMIT_MIB} MiB: {grown}"
