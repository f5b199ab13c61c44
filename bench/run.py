"""`make bench`: Tributary against the bare model, side by side in one run; then the
mixed-priority scenario (bench/priority_mix.py), the reranker (bench/rerank.py) and the
two generation engines (bench/llm.py).

For each Serve mode (how HTTP reaches the ingress, see deployments/launch/main.py) the default
app is started as `make serve` starts it; then, for each scenario (64 connections x 1 text,
8 connections x 32 texts), a few rounds of: the bare model's `encode` at batch 32 on the
same texts with the server idle, then closed-loop load against the server. The replica's
mean batch size comes from /v1/stats around each load run. Medians of the per-round
ratios are checked against the bar of the embeddings slice and written to
docs/benchmarks.md between markers, with the command that produced them.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench import bare_model, bare_runtime, llm, rerank
from bench.loadgen import LoadResult, embedding_bodies, refused_share, run_closed_loop
from bench.priority_mix import MixSettings, PriorityMix, failed_criteria
from bench.priority_mix import render as render_priority
from bench.report import write_section
from bench.server import ROOT, Server, load_config, running_server
from bench.texts import sentences
from deployments.launch.main import DEFAULT_MODE, SERVE_MODES

MODEL = "all-MiniLM-L6-v2"
SCENARIO_NAMES = ("embeddings", "priority", "rerank", "llm")


@dataclass(frozen=True)
class Scenario:
    concurrency: int
    texts_per_request: int
    # The fraction of the bare model's batch-32 throughput this scenario must reach.
    bar: float


SCENARIOS = (Scenario(64, 1, 0.5), Scenario(8, 32, 0.85))
# Ray keeps starting helper processes for a few seconds after the app reports healthy.
SETTLE_S = 10


@dataclass
class Round:
    bare_texts_per_s: float  # the bare model, measured just before this load run
    load: LoadResult
    mean_batch: float

    @property
    def ratio(self) -> float:
        return self.load.texts_per_s / self.bare_texts_per_s


@dataclass
class Measured:
    mode: str
    scenario: Scenario
    rounds: list[Round]

    def median(self, value: Callable[[Round], float]) -> float:
        return statistics.median(value(r) for r in self.rounds)

    @property
    def errors(self) -> int:
        return sum(r.load.errors for r in self.rounds)

    @property
    def refused_share(self) -> float:
        """Of the answers, the share that were refusals with a Retry-After: admission
        keeping the admitted within their class's target (docs/operations.md)."""
        return refused_share(r.load for r in self.rounds)

    @property
    def passes(self) -> bool:
        batch_ok = self.scenario.texts_per_request > 1 or self.median(_mean_batch) >= 8
        return self.errors == 0 and self.median(_ratio) >= self.scenario.bar and batch_ok


def _ratio(r: Round) -> float:
    return r.ratio


def _mean_batch(r: Round) -> float:
    return r.mean_batch


def replica_counters(server: Server) -> tuple[int, int]:
    replica = httpx.get(f"{server.url}/v1/stats", timeout=10).json()["models"][MODEL]["replica"]
    return int(replica["batches"]), int(replica["items"])


class Bench:
    def __init__(
        self,
        duration_s: float,
        bare_duration_s: float,
        rounds: int,
        runtime: str | None = None,
        threads: int = 2,
        passes: int | str = 1,
        honor_retry_after: bool = True,
    ) -> None:
        self.duration_s = duration_s
        self.honor_retry_after = honor_retry_after
        self.bare_duration_s = bare_duration_s
        self.rounds = rounds
        self.texts = sentences(2000)
        self.model = bare_model.load_model()
        # With a runtime, the ceiling is the bare model on that runtime, not torch's.
        self.on_runtime = None
        self.passes, self.threads = 1, threads
        self.ceiling = "`encode`, batch 32, torch's default threads"
        if runtime is not None:
            self.on_runtime, report = bare_runtime.load(
                runtime, threads, passes=passes, batch_sizes=(1, 8, 64)
            )
            print(f"bare model on runtime {runtime}: {report}", file=sys.stderr)
            chosen = report["runtime"]
            # The served model's passes side by side, the bare one's too: the ceiling is
            # the runtime at its best, not at one pass.
            self.passes, self.threads = int(report["passes_in_flight"]), threads
            self.ceiling = f"runtime {runtime}" + (f" ({chosen})" if chosen != runtime else "")
            self.ceiling += f", batch 32, {threads} threads"
            if self.passes > 1:
                self.ceiling += f" in {self.passes} passes side by side"
            self.ceiling += ", tokenising included"

    def bare(self) -> float:
        # With the server idle: the machine is shared and its speed drifts over minutes,
        # so every load run is compared with a bare run taken right before it.
        if self.on_runtime is not None:
            return bare_runtime.texts_per_s(
                self.on_runtime,
                self.texts,
                32,
                self.bare_duration_s,
                passes=self.passes,
                threads=self.threads,
            )
        return bare_model.measure_bare(self.texts, 32, self.bare_duration_s, model=self.model)

    def run_mode(self, mode: str, config: dict) -> list[Measured]:
        with (
            tempfile.TemporaryDirectory() as workdir,
            running_server(config, Path(workdir), mode=mode) as server,
        ):
            time.sleep(SETTLE_S)
            return [
                Measured(mode, s, [self.round(server, mode, s, i) for i in range(self.rounds)])
                for s in SCENARIOS
            ]

    def round(self, server: Server, mode: str, scenario: Scenario, index: int) -> Round:
        bare = self.bare()
        bodies = embedding_bodies(self.texts, scenario.texts_per_request, MODEL, n_bodies=256)
        batches0, items0 = replica_counters(server)
        print(
            f"[{mode}] round {index + 1}/{self.rounds}: bare {bare:.0f} texts/s; "
            f"{scenario.concurrency} connections x {scenario.texts_per_request} text(s)",
            file=sys.stderr,
        )
        load = asyncio.run(
            run_closed_loop(
                "127.0.0.1",
                server.port,
                "/v1/embeddings",
                bodies,
                scenario.texts_per_request,
                scenario.concurrency,
                self.duration_s,
                honor_retry_after=self.honor_retry_after,
            )
        )
        batches1, items1 = replica_counters(server)
        return Round(bare, load, (items1 - items0) / max(batches1 - batches0, 1))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per load run")
    parser.add_argument("--bare-duration", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per scenario")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIO_NAMES),
        help="comma-separated: embeddings (the Serve modes against the bare model), "
        "priority (realtime alone and under a batch-class flood, default mode), "
        "rerank (the served reranker against its bare backend, bench/rerank.py), "
        "llm (continuous against static generation, burst and open loop, bench/llm.py)",
    )
    parser.add_argument(
        "--modes",
        default=",".join([DEFAULT_MODE, *sorted(set(SERVE_MODES) - {DEFAULT_MODE})]),
        help="comma-separated Serve modes to compare (deployments/launch/main.py)",
    )
    parser.add_argument(
        "--priority-rate", type=float, default=5.0, help="realtime requests/s (open loop)"
    )
    parser.add_argument(
        "--priority-duration", type=float, default=20.0, help="measured seconds per phase"
    )
    parser.add_argument("--config", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--runtime",
        default=None,
        help="embeddings scenario: serve the model on this runtime (docs/backends.md) and "
        "compare with the bare model on the same one; prints only",
    )
    parser.add_argument(
        "--ignore-retry-after",
        action="store_true",
        help="embeddings scenario: refused clients ask again at once instead of waiting "
        "their Retry-After (docs/benchmarks.md, 'Clients that ignore Retry-After')",
    )
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(SERVE_MODES)
    if unknown:
        parser.error(f"unknown mode(s) {sorted(unknown)}; known: {sorted(SERVE_MODES)}")
    scenarios = [s for s in args.scenarios.split(",") if s]
    if not scenarios or set(scenarios) - set(SCENARIO_NAMES):
        parser.error(f"--scenarios: a comma-separated subset of {', '.join(SCENARIO_NAMES)}")

    extra = sys.argv[1:] if argv is None else argv
    command = "make bench" + (f" BENCH_ARGS='{' '.join(extra)}'" if extra else "")
    config = load_config(args.config)
    ok = True
    if "embeddings" in scenarios:
        ok &= run_embeddings(args, modes, config, command)
    if "priority" in scenarios:
        ok &= run_priority(args, config, command)
    if "rerank" in scenarios:
        ok &= run_rerank(args)
    if "llm" in scenarios:
        ok &= run_llm(args, command)
    sys.exit(0 if ok else 1)


def _publish(args: argparse.Namespace, name: str, section: str) -> None:
    print(section)
    if not args.no_write:
        write_section(args.out, name, section)
        print(f"written to {args.out}", file=sys.stderr)


def run_embeddings(args: argparse.Namespace, modes: list[str], config: dict, command: str) -> bool:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    models = config["applications"][0]["args"]["embedding_models"]
    # The ceiling is the bare model on the runtime the server runs (`auto`: the one it
    # chooses here), not torch's, unless the config runs torch itself.
    runtime = args.runtime or models[0].get("runtime", "torch")
    if args.runtime is not None:
        config = copy.deepcopy(config)
        for model in config["applications"][0]["args"]["embedding_models"]:
            model["runtime"] = runtime
    honor = not args.ignore_retry_after
    if runtime != "torch":
        bench = Bench(
            args.duration,
            args.bare_duration,
            args.rounds,
            runtime,
            models[0]["torch_threads"],
            models[0].get("passes_in_flight", 1),
            honor_retry_after=honor,
        )
    else:
        bench = Bench(args.duration, args.bare_duration, args.rounds, honor_retry_after=honor)
    results = [m for mode in modes for m in bench.run_mode(mode, config)]
    section = render(started, command, results, bench.ceiling, bench.honor_retry_after)
    # Not the published section: that one is the config's, with clients that behave.
    if args.runtime is not None or args.ignore_retry_after:
        print(section)
        return True
    _publish(args, "embeddings-v0", section)
    return not [m for m in results if m.mode == DEFAULT_MODE and not m.passes]


def run_rerank(args: argparse.Namespace) -> bool:
    rerank_args = ["--rounds", str(args.rounds), "--config", str(args.config)]
    rerank_args += ["--out", str(args.out)] + (["--no-write"] if args.no_write else [])
    try:
        rerank.main(rerank_args)
    except SystemExit as exit_:
        return exit_.code in (0, None)
    return True


def run_llm(args: argparse.Namespace, command: str) -> bool:
    llm_args = ["--rounds", str(args.rounds), "--config", str(args.config), "--out", str(args.out)]
    llm_args += ["--command", command] + (["--no-write"] if args.no_write else [])
    try:
        llm.main(llm_args)
    except SystemExit as exit_:
        return exit_.code in (0, None)
    return True


def run_priority(args: argparse.Namespace, config: dict, command: str) -> bool:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    settings = MixSettings(args.priority_rate, args.priority_duration, args.rounds)
    rounds = PriorityMix(settings).run(config)
    _publish(args, "priority-mix", render_priority(started, command, settings, config, rounds))
    return not failed_criteria(rounds)


def render(
    started: str,
    command: str,
    results: list[Measured],
    ceiling: str,
    honor_retry_after: bool = True,
) -> str:
    rounds = len(results[0].rounds) if results else 0
    refused = (
        "wait the Retry-After as the OpenAI and Cohere SDKs do"
        if honor_retry_after
        else "ask again at once, ignoring the Retry-After"
    )
    lines = [
        f"Run {started} with `{command}` on {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}. Each row: the median "
        f"of {rounds} rounds, each round a bare-model run ({ceiling}) followed at once by a "
        "load run against the server. Its clients keep one request each in flight and, "
        f"refused (429/503), {refused}; *refused* is the share of answers that were such "
        "refusals, *failed* every other non-200 or error.",
        "",
        "| mode | load | bare texts/s | req/s | texts/s | × bare | p50 ms | p95 ms | p99 ms "
        "| mean batch | refused | failed | bar |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in results:
        mode = f"**{m.mode}** (default)" if m.mode == DEFAULT_MODE else m.mode
        bar = f"≥ {m.scenario.bar}×" + (", batch ≥ 8" if m.scenario.texts_per_request == 1 else "")
        lines.append(
            f"| {mode} | {m.scenario.concurrency} conns × {m.scenario.texts_per_request} text "
            f"| {m.median(lambda r: r.bare_texts_per_s):.0f} "
            f"| {m.median(lambda r: r.load.req_per_s):.1f} "
            f"| {m.median(lambda r: r.load.texts_per_s):.0f} | {m.median(_ratio):.2f} "
            f"| {m.median(lambda r: r.load.p50_ms):.0f} | {m.median(lambda r: r.load.p95_ms):.0f} "
            f"| {m.median(lambda r: r.load.p99_ms):.0f} | {m.median(_mean_batch):.1f} "
            f"| {m.refused_share:.0%} | {m.errors} | {bar}: {'pass' if m.passes else 'FAIL'} |"
        )
    lines.append("")
    lines.append(
        "Per round, × bare: "
        + "; ".join(
            f"{m.mode} {m.scenario.concurrency}×{m.scenario.texts_per_request}: "
            + ", ".join(f"{r.ratio:.2f}" for r in m.rounds)
            for m in results
        )
        + "."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
