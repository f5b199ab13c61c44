"""Turns at a shared device, on against off (docs/benchmarks.md, "One device, several models").

The default app (embedder, reranker and LLM on one machine's cores) is served with the
device arbiter on, on with `pause_for_realtime: false` (`--pause-off-too`), and off, in one
invocation. On each server, each round:

  A. realtime alone: single-text embeddings with `X-Priority: realtime`, open loop at a
     light rate, a short warm-up then D measured seconds;
  B. the same realtime load while the LLM runs 32 batch-class generations (closed loop)
     and the reranker a batch-class flood (closed loop, Retry-After honoured); the flood
     gets a few seconds to saturate first. What the flood completes inside the measured
     window is its throughput: reranked documents/s and generated tokens/s.

Then, arbiter on, the priority swap: the embedder and the reranker both flooded at the batch
class, with `device_turns.priority` 10 / 0 and then 0 / 10 (a server each): the share of the
device each model held and its mean wait for a turn (from /v1/stats) follow the priority, and
the lower one keeps at least its `min_share`. Only turns that queue can be ordered: on a card
that runs 4 passes at once, or whose floods leave it idle between passes, the swap needs
`--passes-at-once 1` and more connections a flood (`--swap-connections`).

    .venv/bin/python -m bench.device_share                       # 3 rounds of 20 s each
    .venv/bin/python -m bench.device_share --rounds 1 --duration 10 --no-swap   # quick
    python -m bench.device_share --config serve_config.gpu.yaml --one-card     # one GPU
    python -m bench.device_share --config serve_config.gpu.yaml --one-card --swap-only \
        --passes-at-once 1 --swap-connections 24                           # the order alone

Goals (issue 28): realtime p99 under the flood <= 1.5x its idle p99 with the arbiter on;
flood throughput on >= 0.9x off; the swap swaps the order; the low model >= min_share.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.loadgen import embedding_bodies
from bench.open_loop import OpenLoopResult, run_open_loop
from bench.server import load_config, running_server
from bench.texts import sentences

EMBEDDER = "all-MiniLM-L6-v2"
RERANKER = "minilm-rerank"
LLM = "tiny-llama-demo"
GENERATIONS = 32
GENERATION_TOKENS = 64
FLOOD_CONNECTIONS = 4  # closed-loop connections of each flood (rerank, embeddings)
RERANK_DOCS = 32
EMBED_FLOOD_TEXTS = 32
SATURATE_S = 5.0
WARMUP_S = 2.0
SETTLE_S = 5.0


@dataclass
class Round:
    alone_p50_ms: float
    alone_p99_ms: float
    flooded_p50_ms: float
    flooded_p99_ms: float
    realtime_failed: int
    rerank_docs_per_s: float
    llm_tokens_per_s: float
    flood_refused: int
    # How late the realtime client sent, at worst, alone and under the flood: its own
    # delay, which the open loop charges to the server (latency runs from when it was due).
    alone_send_lag_ms: float = 0.0
    flooded_send_lag_ms: float = 0.0
    # What the failed realtime requests got: status -> count (0: no answer in time).
    realtime_failures: dict[int, int] = field(default_factory=dict)

    @property
    def p99_ratio(self) -> float:
        return self.flooded_p99_ms / self.alone_p99_ms


@dataclass
class Setting:
    arbiter: bool
    pause: bool = True  # pause_for_realtime, where the arbiter is on
    rounds: list[Round] = field(default_factory=list)
    shares: dict[str, float] = field(default_factory=dict)  # of held device time, flooded
    # The embedder's realtime passes that stopped others (pause_for_realtime), in all.
    paused: dict[str, float] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(getattr(r, name) for r in self.rounds)


@dataclass
class Swap:
    priorities: dict[str, int]
    shares: dict[str, float]
    min_share: float
    waits_ms: dict[str, float] = field(default_factory=dict)  # mean device wait per turn


# On a GPU, the three models on one card under fractional claims, one replica each.
ONE_CARD_GPUS = {"embedding_models": 0.25, "rerank_models": 0.25, "generation_models": 0.5}


def config_with(
    args: argparse.Namespace,
    arbiter: bool,
    priorities: dict[str, int] | None = None,
    pause: bool = True,
) -> dict[str, Any]:
    """The config the run serves (`--config`, else serve_config.yaml), with the arbiter on
    or off (and its realtime pause), the models' priorities, and with `--one-card` every
    model on one GPU."""
    one_card = args.one_card
    config = load_config(args.config) if args.config else load_config()
    app = config["applications"][0]["args"]
    # The config's other arbiter settings (passes_at_once, ...) stay as it has them.
    app.setdefault("device_arbiter", {}).update(enabled=arbiter, pause_for_realtime=pause)
    if args.passes_at_once is not None:
        app["device_arbiter"]["passes_at_once"] = args.passes_at_once
    for kind in ("embedding_models", "rerank_models", "generation_models"):
        for model in app.get(kind, []):
            if priorities and model["name"] in priorities:
                model["device_turns"] = {"priority": priorities[model["name"]]}
            if one_card:
                deployment = model.setdefault("deployment", {})
                deployment.pop("autoscaling_config", None)
                deployment["num_replicas"] = 1
                deployment["ray_actor_options"] = {"num_cpus": 1, "num_gpus": ONE_CARD_GPUS[kind]}
    if one_card:
        app["ingress"]["deployment"]["num_replicas"] = 1
        app["ingress"]["realtime_replica"] = False
    return config


class Flood:
    """Closed-loop batch-class clients that count what finishes inside a window."""

    def __init__(self, url: str, connections: int = FLOOD_CONNECTIONS) -> None:
        self.url = url
        self.connections = connections  # each of the rerank and embedding floods
        self.window: tuple[float, float] = (float("inf"), float("inf"))
        self.done: dict[str, float] = {}
        self.refused = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def count(self, what: str, amount: float) -> None:
        start, end = self.window
        if start <= time.monotonic() <= end:
            self.done[what] = self.done.get(what, 0.0) + amount

    async def _loop(self, client: httpx.AsyncClient, path: str, body: dict, what: str) -> None:
        while not self._stop.is_set():
            try:
                response = await client.post(
                    self.url + path, json=body, headers={"X-Priority": "batch"}, timeout=300
                )
            except httpx.HTTPError:
                await asyncio.sleep(0.2)
                continue
            if response.status_code in (429, 503):
                self.refused += 1
                await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
                continue
            if response.status_code != 200:
                raise RuntimeError(f"{path}: {response.status_code} {response.text[:300]}")
            payload = response.json()
            if what == "tokens":
                self.count(what, payload["usage"]["completion_tokens"])
            else:
                self.count(what, len(body.get("documents") or body.get("input") or []))

    def start(self, client: httpx.AsyncClient, kinds: tuple[str, ...]) -> None:
        texts = sentences(4096, seed=28)
        if "llm" in kinds:
            for i in range(GENERATIONS):
                body = {
                    "model": LLM,
                    "messages": [{"role": "user", "content": texts[i]}],
                    "max_tokens": GENERATION_TOKENS,
                    "temperature": 0,
                }
                self._spawn(client, "/v1/chat/completions", body, "tokens")
        if "rerank" in kinds:
            for i in range(self.connections):
                docs = texts[i * RERANK_DOCS : (i + 1) * RERANK_DOCS]
                body = {"model": RERANKER, "query": texts[-1 - i], "documents": docs}
                self._spawn(client, "/v1/rerank", body, "docs")
        if "embed" in kinds:
            for i in range(self.connections):
                chunk = texts[1000 + i * EMBED_FLOOD_TEXTS : 1000 + (i + 1) * EMBED_FLOOD_TEXTS]
                self._spawn(client, "/v1/embeddings", {"model": EMBEDDER, "input": chunk}, "texts")

    def _spawn(self, client: httpx.AsyncClient, path: str, body: dict, what: str) -> None:
        self._tasks.append(asyncio.create_task(self._loop(client, path, body, what)))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=False)

    def rate(self, what: str) -> float:
        start, end = self.window
        return self.done.get(what, 0.0) / (end - start)


def turn_sums(stats: dict[str, Any], key: str) -> dict[str, float]:
    """Each model's `key` of its device turns (held_s, wait_s, turns), all classes summed,
    from /v1/stats."""
    sums: dict[str, float] = {}
    for name, entry in stats["models"].items():
        turns = (entry.get("replica") or {}).get("device_turns") or {}
        sums[name] = sum(c.get(key, 0) for c in turns.get("by_class", {}).values())
    return sums


def held_by_model(stats: dict[str, Any]) -> dict[str, float]:
    """Seconds each model held the device, all classes, from /v1/stats."""
    return turn_sums(stats, "held_s")


def mean_waits_ms(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Each flooded model's mean wait for a turn between two /v1/stats, in ms."""
    turns_then, turns_now = turn_sums(before, "turns"), turn_sums(after, "turns")
    waited_then, waited_now = turn_sums(before, "wait_s"), turn_sums(after, "wait_s")
    waits: dict[str, float] = {}
    for name in (EMBEDDER, RERANKER):
        turns = turns_now[name] - turns_then[name]
        waited = waited_now[name] - waited_then[name]
        waits[name] = round(1e3 * waited / turns, 2) if turns else 0.0
    return waits


def paused_by(stats: dict[str, Any]) -> dict[str, float]:
    """The embedder's stops of other models' passes for its realtime ones, from /v1/stats."""
    turns = (stats["models"][EMBEDDER].get("replica") or {}).get("device_turns") or {}
    return {key: turns.get(key, 0) for key in ("paused", "paused_s", "continued_stale")}


def shares_between(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    total = sum(delta.values())
    return {name: round(d / total, 4) if total else 0.0 for name, d in delta.items()}


async def one_round(url: str, port: int, rate: float, duration_s: float) -> Round:
    bodies = embedding_bodies(sentences(2000, seed=7), 1, EMBEDDER, 2000)
    realtime = {"X-Priority": "realtime"}
    alone = await run_open_loop(
        "127.0.0.1", port, "/v1/embeddings", bodies, rate, duration_s, WARMUP_S, realtime
    )
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as client:
        flood = Flood(url)
        flood.start(client, ("llm", "rerank"))
        await asyncio.sleep(SATURATE_S)
        began = time.monotonic()
        flood.window = (began + WARMUP_S, began + WARMUP_S + duration_s)
        flooded = await run_open_loop(
            "127.0.0.1", port, "/v1/embeddings", bodies, rate, duration_s, WARMUP_S, realtime
        )
        await flood.stop()
    return Round(
        alone_p50_ms=alone.p50_ms,
        alone_p99_ms=alone.p99_ms,
        flooded_p50_ms=flooded.p50_ms,
        flooded_p99_ms=flooded.p99_ms,
        realtime_failed=alone.non_ok_total + flooded.non_ok_total,
        rerank_docs_per_s=round(flood.rate("docs"), 1),
        llm_tokens_per_s=round(flood.rate("tokens"), 1),
        flood_refused=flood.refused,
        alone_send_lag_ms=round(alone.max_send_lag_ms, 1),
        flooded_send_lag_ms=round(flooded.max_send_lag_ms, 1),
        realtime_failures=_failures(alone, flooded),
    )


def _failures(*runs: OpenLoopResult) -> dict[int, int]:
    """Non-200 answers of `runs` by status, warm-ups included; 0 counts no answer."""
    found: dict[int, int] = {}
    for run in runs:
        for status, count in run.all_status_counts.items():
            if status != 200:
                found[status] = found.get(status, 0) + count
        if run.no_answer_total:
            found[0] = found.get(0, 0) + run.no_answer_total
    return found


async def swap_shares(
    url: str, duration_s: float, connections: int
) -> tuple[dict[str, float], dict[str, float]]:
    """The two flooded models' shares of the device's held time, and their mean waits."""
    limits = httpx.Limits(max_connections=max(32, 2 * connections))
    async with httpx.AsyncClient(limits=limits) as client:
        flood = Flood(url, connections)
        flood.start(client, ("embed", "rerank"))
        await asyncio.sleep(SATURATE_S)
        before = (await client.get(url + "/v1/stats", timeout=30)).json()
        await asyncio.sleep(duration_s)
        after = (await client.get(url + "/v1/stats", timeout=30)).json()
        await flood.stop()
    shares = shares_between(held_by_model(before), held_by_model(after))
    held = {name: shares.get(name, 0.0) for name in (EMBEDDER, RERANKER)}
    return held, mean_waits_ms(before, after)


def serve_setting(
    arbiter: bool, args: argparse.Namespace, workdir: Path, pause: bool = True
) -> Setting:
    setting = Setting(arbiter, pause)
    config = config_with(args, arbiter, pause=pause)
    with running_server(config, workdir, mode=args.mode) as server:
        time.sleep(SETTLE_S)
        for n in range(args.rounds):
            before = held_by_model(httpx.get(server.url + "/v1/stats", timeout=30).json())
            result = asyncio.run(one_round(server.url, server.port, args.rate, args.duration))
            after = held_by_model(httpx.get(server.url + "/v1/stats", timeout=30).json())
            setting.rounds.append(result)
            if arbiter:
                setting.shares = shares_between(before, after)
            print(f"{label(setting)} round {n + 1}: {asdict(result)}")
            sys.stdout.flush()
        if arbiter:
            setting.paused = paused_by(httpx.get(server.url + "/v1/stats", timeout=30).json())
    return setting


def serve_swap(priorities: dict[str, int], args: argparse.Namespace, workdir: Path) -> Swap:
    with running_server(config_with(args, True, priorities), workdir, mode=args.mode) as server:
        time.sleep(SETTLE_S)
        shares, waits = asyncio.run(swap_shares(server.url, args.duration, args.swap_connections))
    swap = Swap(priorities, shares, min_share=0.05, waits_ms=waits)
    print(f"swap {priorities}: shares {shares}, mean device waits {waits} ms")
    return swap


def label(setting: Setting) -> str:
    if not setting.arbiter:
        return "off"
    return "on" if setting.pause else "on, no pause"


def render(settings: list[Setting], swaps: list[Swap], args: argparse.Namespace) -> str:
    rounds = f"{args.rounds} rounds of " if settings else ""
    lines = [
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"{rounds}{args.duration:g} s windows at {args.rate:g} realtime req/s; "
        f"passes at once: {args.passes_at_once or 'as configured'}; "
        f"swap floods {args.swap_connections} connections each"
        + ("; medians:" if settings else ":"),
    ]
    if settings:
        lines += render_settings(settings)
    if swaps:
        lines += [
            "",
            "| priority (embedder / reranker) | embedder's share | reranker's share "
            "| mean device wait, embedder / reranker, ms |",
            "|---|---|---|---|",
        ]
        for swap in swaps:
            p, waits = swap.priorities, swap.waits_ms
            lines.append(
                f"| {p[EMBEDDER]} / {p[RERANKER]} | {swap.shares[EMBEDDER]:.3f} | "
                f"{swap.shares[RERANKER]:.3f} | {waits.get(EMBEDDER, 0.0):.2f} / "
                f"{waits.get(RERANKER, 0.0):.2f} |"
            )
    return "\n".join(lines)


def render_settings(settings: list[Setting]) -> list[str]:
    on, off = settings[0], settings[-1]
    lines = [
        "",
        "| arbiter | realtime p50/p99 alone, ms | under the flood, ms | p99 ratio | "
        "rerank docs/s | LLM tokens/s | realtime failed | client's worst send lag, ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in settings:
        lines.append(
            f"| {label(s)} | {s.median('alone_p50_ms'):.1f} / "
            f"{s.median('alone_p99_ms'):.1f} | {s.median('flooded_p50_ms'):.1f} / "
            f"{s.median('flooded_p99_ms'):.1f} | **{s.median('p99_ratio'):.2f}x** | "
            f"{s.median('rerank_docs_per_s'):.0f} | {s.median('llm_tokens_per_s'):.0f} | "
            f"{sum(r.realtime_failed for r in s.rounds)} | "
            f"{max(r.flooded_send_lag_ms for r in s.rounds):.1f} |"
        )
    docs = on.median("rerank_docs_per_s") / max(off.median("rerank_docs_per_s"), 1e-9)
    tokens = on.median("llm_tokens_per_s") / max(off.median("llm_tokens_per_s"), 1e-9)
    lines += [
        "",
        f"Flood throughput, on / off: rerank {docs:.2f}x, LLM {tokens:.2f}x. "
        f"Device time held under the flood (arbiter on): {on.shares}.",
        "Stops for the embedder's realtime passes: "
        + "; ".join(f"{label(s)}: {s.paused}" for s in settings if s.arbiter)
        + ".",
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=5.0, help="realtime requests/s")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--no-swap", action="store_true", help="skip the priority swap")
    which.add_argument(
        "--swap-only", action="store_true", help="only the priority swap, no on / off servers"
    )
    parser.add_argument(
        "--swap-connections",
        type=int,
        default=FLOOD_CONNECTIONS,
        help="closed-loop connections of each of the swap's two floods (more: a busier device)",
    )
    parser.add_argument(
        "--passes-at-once",
        type=int,
        help="the arbiter's passes_at_once on every server (default: the config's)",
    )
    parser.add_argument(
        "--pause-off-too",
        action="store_true",
        help="also serve the arbiter on with pause_for_realtime: false, between on and off",
    )
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--config", type=Path, help="serve this config (default serve_config.yaml)")
    parser.add_argument("--mode", help="the launcher's serving mode (default: its default)")
    parser.add_argument(
        "--one-card",
        action="store_true",
        help="every model on one GPU: num_gpus 0.25 / 0.25 / 0.5, one replica each",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tributary-device-share-") as tmp:
        work = Path(tmp)
        settings = []
        runs = [(True, True), *([(True, False)] if args.pause_off_too else []), (False, True)]
        if args.swap_only:
            runs = []
        for arbiter, pause in runs:
            (work / f"{arbiter}-{pause}").mkdir()
            settings.append(serve_setting(arbiter, args, work / f"{arbiter}-{pause}", pause))
        swaps = []
        if not args.no_swap:
            for n, priorities in enumerate(
                ({EMBEDDER: 10, RERANKER: 0}, {EMBEDDER: 0, RERANKER: 10})
            ):
                (work / f"swap{n}").mkdir()
                swaps.append(serve_swap(priorities, args, work / f"swap{n}"))
    print()
    print(render(settings, swaps, args))
    if args.json:
        figures = {
            "settings": [
                {
                    "arbiter": s.arbiter,
                    "pause_for_realtime": s.pause,
                    "rounds": [asdict(r) for r in s.rounds],
                    "shares": s.shares,
                    "paused": s.paused,
                }
                for s in settings
            ],
            "swaps": [asdict(s) for s in swaps],
        }
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
