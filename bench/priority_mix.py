"""The mixed-priority scenario of `make bench`: realtime latency alone and under a flood.

On one server (the default app, default mode), after a settle, each round is
  A. realtime alone: single-text requests with `X-Priority: realtime`, open loop at a
     steady rate, a short warmup then D measured seconds;
  B. the same realtime load under a batch-class flood: 48 connections, closed loop,
     32 texts per request, `X-Priority: batch`, honouring Retry-After; the flood gets
     5 s to saturate before realtime starts; then the flood stops and the queues drain.
Per-class batch sizes and the gate's aged turns come from /v1/stats deltas around each
phase. Pass: median p99 under flood at most twice alone, no realtime request refused or failed,
and the batch class completes work.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.loadgen import LoadResult, embedding_bodies, run_closed_loop
from bench.open_loop import OpenLoopResult, run_open_loop
from bench.server import Server, running_server
from bench.texts import sentences
from deployments.launch.main import DEFAULT_MODE

MODEL = "all-MiniLM-L6-v2"
CLASSES = ("realtime", "normal", "batch")
FLOOD_CONNECTIONS = 48
FLOOD_TEXTS = 32
SATURATE_S = 5.0
WARMUP_S = 2.0
SETTLE_S = 10
DRAIN_TIMEOUT_S = 120.0
MAX_P99_RATIO = 2.0


@dataclass(frozen=True)
class MixSettings:
    rate_per_s: float = 5.0
    duration_s: float = 20.0
    rounds: int = 3


@dataclass
class MixRound:
    alone: OpenLoopResult
    flooded: OpenLoopResult
    flood: LoadResult
    batch_alone: dict[str, float]  # per-class mean batch at the replica, phase A
    batch_flooded: dict[str, float]  # the same, phase B (saturation and drain included)
    aged_turns: int  # the gate's aged turns during phase B
    refused: dict[str, int]  # batch-class refusals at the ingress in phase B, by reason

    @property
    def p99_ratio(self) -> float:
        return self.flooded.p99_ms / self.alone.p99_ms

    @property
    def realtime_non_ok(self) -> int:
        return self.alone.non_ok_total + self.flooded.non_ok_total

    def shed(self, status: int) -> int:
        return self.flood.status_counts.get(status, 0)


def class_batch_sizes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Mean batch size per class at the replica between two `replica` stats snapshots;
    0.0 for a class that ran no batch."""
    sizes = {}
    for name in CLASSES:
        b0 = before["classes"].get(name, {})
        b1 = after["classes"].get(name, {})
        batches = b1.get("batches", 0) - b0.get("batches", 0)
        items = b1.get("items", 0) - b0.get("items", 0)
        sizes[name] = items / batches if batches > 0 else 0.0
    return sizes


def refused_delta(before: dict[str, Any], after: dict[str, Any], name: str) -> dict[str, int]:
    """Refusals of class ``name`` by reason between two `ingress` stats snapshots."""
    r0 = before["classes"][name]["refused"]
    r1 = after["classes"][name]["refused"]
    return {k: n - r0.get(k, 0) for k, n in sorted(r1.items()) if n - r0.get(k, 0)}


def failed_criteria(rounds: list[MixRound]) -> list[str]:
    """The pass criteria of the issue's "Done when" that these rounds miss."""
    failed = []
    ratio = statistics.median(r.p99_ratio for r in rounds)
    if not ratio <= MAX_P99_RATIO:  # NaN (no realtime answer at all) fails too
        failed.append(f"median realtime p99 ratio {ratio:.2f} > {MAX_P99_RATIO}")
    non_ok = sum(r.realtime_non_ok for r in rounds)
    if non_ok:
        failed.append(f"{non_ok} realtime request(s) refused or failed")
    if not all(r.flood.texts_per_s > 0 for r in rounds):
        failed.append("the batch class completed no work in some round")
    return failed


def _stats(server: Server) -> dict[str, Any]:
    return httpx.get(f"{server.url}/v1/stats", timeout=10).json()["models"][MODEL]


def _idle(stats: dict[str, Any]) -> bool:
    classes = stats["ingress"]["classes"].values()
    gate = stats["replica"]["gate"]
    return (
        all(c["queued_items"] == 0 and c["in_flight"] == 0 for c in classes)
        and not gate["busy"]
        and not any(gate["waiting"].values())
    )


def wait_drained(server: Server) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while not _idle(_stats(server)):
        if time.monotonic() > deadline:
            print(f"warning: queues not drained after {DRAIN_TIMEOUT_S:.0f} s", file=sys.stderr)
            return
        time.sleep(0.5)
    time.sleep(1.0)


def _run(main: Coroutine[Any, Any, Any]) -> Any:
    try:
        import uvloop  # cheaper: leaves more CPU to the server under test
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


class PriorityMix:
    def __init__(self, settings: MixSettings) -> None:
        self.settings = settings
        texts = sentences(2000)
        self.realtime_bodies = embedding_bodies(texts, 1, MODEL, n_bodies=256)
        self.flood_bodies = embedding_bodies(texts, FLOOD_TEXTS, MODEL, n_bodies=64)

    def run(self, config: dict) -> list[MixRound]:
        with (
            tempfile.TemporaryDirectory() as workdir,
            running_server(config, Path(workdir), mode=DEFAULT_MODE) as server,
        ):
            time.sleep(SETTLE_S)
            return [self.round(server, i) for i in range(self.settings.rounds)]

    def _realtime(self, port: int) -> Coroutine[Any, Any, OpenLoopResult]:
        return run_open_loop(
            "127.0.0.1",
            port,
            "/v1/embeddings",
            self.realtime_bodies,
            self.settings.rate_per_s,
            self.settings.duration_s,
            warmup_s=WARMUP_S,
            headers={"X-Priority": "realtime"},
        )

    async def _flooded(self, port: int) -> tuple[OpenLoopResult, LoadResult]:
        flood = asyncio.create_task(
            run_closed_loop(
                "127.0.0.1",
                port,
                "/v1/embeddings",
                self.flood_bodies,
                FLOOD_TEXTS,
                FLOOD_CONNECTIONS,
                self.settings.duration_s,
                # Its measured window is the realtime one: both start after these.
                warmup_s=SATURATE_S + WARMUP_S,
                progress=False,
                headers={"X-Priority": "batch"},
                honor_retry_after=True,
            )
        )
        try:
            await asyncio.sleep(SATURATE_S)
            realtime = await self._realtime(port)
        except BaseException:
            flood.cancel()
            raise
        return realtime, await flood

    def round(self, server: Server, index: int) -> MixRound:
        s = self.settings
        say = f"[priority] round {index + 1}/{s.rounds}:"
        print(f"{say} realtime alone, {s.rate_per_s:g}/s for {s.duration_s:g} s", file=sys.stderr)
        s0 = _stats(server)
        alone = _run(self._realtime(server.port))
        s1 = _stats(server)
        print(f"{say} alone: {alone.summary()}", file=sys.stderr)
        print(
            f"{say} batch flood ({FLOOD_CONNECTIONS} conns x {FLOOD_TEXTS} texts) + realtime",
            file=sys.stderr,
        )
        flooded, flood = _run(self._flooded(server.port))
        wait_drained(server)
        s2 = _stats(server)
        print(f"{say} realtime under flood: {flooded.summary()}", file=sys.stderr)
        print(
            f"{say} flood: {flood.summary()}; realtime send lag ≤ "
            f"{max(alone.max_send_lag_ms, flooded.max_send_lag_ms):.1f} ms",
            file=sys.stderr,
        )
        return MixRound(
            alone=alone,
            flooded=flooded,
            flood=flood,
            batch_alone=class_batch_sizes(s0["replica"], s1["replica"]),
            batch_flooded=class_batch_sizes(s1["replica"], s2["replica"]),
            aged_turns=s2["replica"]["gate"]["aged_turns"] - s1["replica"]["gate"]["aged_turns"],
            refused=refused_delta(s1["ingress"], s2["ingress"], "batch"),
        )


def _batching(config: dict) -> str:
    """The model's per-class batching from the config, for the record."""
    try:
        model = config["applications"][0]["args"]["embedding_models"][0]
        batching = model["batching"]
    except (KeyError, IndexError, TypeError):
        return "(batching not found in the config)"
    return "; ".join(
        f"{name} " + ", ".join(f"{k} {v}" for k, v in batching[name].items())
        for name in CLASSES
        if name in batching
    )


_COLUMNS = (
    "| round | rt p50 alone | rt p99 alone | rt p50 flood | rt p99 flood | p99 × "
    "| rt non-200 | batch texts/s | batch 429 | batch 503 | batch refused "
    "| mean batch rt alone "
    "| mean batch rt / batch, flood | aged turns |"
)


def _cells(fmt: Callable[[Callable[[MixRound], float], str], str]) -> list[str]:
    return [
        fmt(lambda r: r.alone.p50_ms, ".0f"),
        fmt(lambda r: r.alone.p99_ms, ".0f"),
        fmt(lambda r: r.flooded.p50_ms, ".0f"),
        fmt(lambda r: r.flooded.p99_ms, ".0f"),
        fmt(lambda r: r.p99_ratio, ".2f"),
        fmt(lambda r: r.realtime_non_ok, "d"),
        fmt(lambda r: r.flood.texts_per_s, ".0f"),
        fmt(lambda r: r.shed(429), "d"),
        fmt(lambda r: r.shed(503), "d"),
        fmt(lambda r: sum(r.refused.values()), "d"),
        fmt(lambda r: r.batch_alone["realtime"], ".1f"),
        fmt(lambda r: r.batch_flooded["realtime"], ".1f")
        + " / "
        + fmt(lambda r: r.batch_flooded["batch"], ".1f"),
        fmt(lambda r: r.aged_turns, "d"),
    ]


def render(
    started: str, command: str, settings: MixSettings, config: dict, rounds: list[MixRound]
) -> str:
    def median(value: Callable[[MixRound], float], spec: str) -> str:
        m = statistics.median(value(r) for r in rounds)
        return format(round(m) if spec == "d" else m, spec)

    failed = failed_criteria(rounds)
    lines = [
        f"Run {started} with `{command}` on {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}: {len(rounds)} rounds, realtime "
        f"{settings.rate_per_s:g} req/s for {settings.duration_s:g} s per phase; flood "
        f"{FLOOD_CONNECTIONS} connections × {FLOOD_TEXTS} texts. Latencies in ms. "
        f"Batching: {_batching(config)}.",
        "",
        _COLUMNS,
        "|" + "---|" * _COLUMNS.count(" | ") + "---|",
        "| **median** | " + " | ".join(_cells(median)) + " |",
    ]
    for i, r in enumerate(rounds):
        cells = _cells(
            lambda value, spec, r=r: format(round(value(r)) if spec == "d" else value(r), spec)
        )
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Batch-class refusals at the ingress in phase B, by reason: "
        + "; ".join(
            f"round {i + 1}: " + (", ".join(f"{k} {n}" for k, n in r.refused.items()) or "none")
            for i, r in enumerate(rounds)
        )
        + "."
    )
    lines.append(
        "Realtime client's worst send lag per round (late sends count as latency): "
        + ", ".join(
            f"{max(r.alone.max_send_lag_ms, r.flooded.max_send_lag_ms):.0f}" for r in rounds
        )
        + " ms."
    )
    verdict = "pass" if not failed else "FAIL: " + "; ".join(failed)
    lines.append(
        f"Criteria (median p99 × ≤ {MAX_P99_RATIO}, no realtime non-200, batch texts/s > 0 "
        f"in every round): **{verdict}**."
    )
    return "\n".join(lines)
