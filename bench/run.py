"""`make bench`: Tributary against the bare model, side by side in one run.

1. The bare model: `encode` in batches of 32 on the benchmark texts (no server running).
2. For each Serve mode (how HTTP reaches the ingress, see deployments/launch.py): start the
   default app, then closed-loop load with one text per request and with 32 texts per
   request; the replica's mean batch size comes from /v1/stats before and after.
3. Ratios to the bare model, checked against the bar of the embeddings slice, written to
   docs/benchmarks.md between markers, with the command that produced them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.loadgen import LoadResult, embedding_bodies, run_closed_loop
from bench.report import write_section
from bench.server import ROOT, Server, load_config, running_server
from bench.texts import sentences
from deployments.launch import DEFAULT_MODE, SERVE_MODES

MODEL = "all-MiniLM-L6-v2"


@dataclass(frozen=True)
class Scenario:
    concurrency: int
    texts_per_request: int
    # The fraction of the bare model's batch-32 throughput this scenario must reach.
    bar: float


SCENARIOS = (Scenario(64, 1, 0.5), Scenario(8, 32, 0.85))


@dataclass
class Measured:
    mode: str
    scenario: Scenario
    load: LoadResult
    mean_batch: float


def measure_bare(duration_s: float) -> dict[str, float]:
    # A fresh process, so the model's threads start as they would in any script.
    out = subprocess.run(
        [sys.executable, "-m", "bench.bare_model", "--duration", str(duration_s)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def replica_counters(server: Server) -> tuple[int, int]:
    replica = httpx.get(f"{server.url}/v1/stats", timeout=10).json()["models"][MODEL]["replica"]
    return int(replica["batches"]), int(replica["items"])


def run_scenario(server: Server, mode: str, scenario: Scenario, duration_s: float) -> Measured:
    texts = sentences(2000)
    bodies = embedding_bodies(texts, scenario.texts_per_request, MODEL, n_bodies=256)
    batches0, items0 = replica_counters(server)
    print(
        f"[{mode}] {scenario.concurrency} connections x {scenario.texts_per_request} text(s)",
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
            duration_s,
        )
    )
    batches1, items1 = replica_counters(server)
    mean_batch = (items1 - items0) / max(batches1 - batches0, 1)
    return Measured(mode, scenario, load, mean_batch)


def run_mode(mode: str, config: dict, duration_s: float) -> list[Measured]:
    with (
        tempfile.TemporaryDirectory() as workdir,
        running_server(config, Path(workdir), mode=mode) as server,
    ):
        return [run_scenario(server, mode, s, duration_s) for s in SCENARIOS]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per load run")
    parser.add_argument("--bare-duration", type=float, default=15.0)
    parser.add_argument(
        "--modes",
        default=",".join([DEFAULT_MODE, *sorted(set(SERVE_MODES) - {DEFAULT_MODE})]),
        help="comma-separated Serve modes to compare (deployments/launch.py)",
    )
    parser.add_argument("--config", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(SERVE_MODES)
    if unknown:
        parser.error(f"unknown mode(s) {sorted(unknown)}; known: {sorted(SERVE_MODES)}")

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print("bare model ...", file=sys.stderr)
    bare = measure_bare(args.bare_duration)
    config = load_config(args.config)
    results = [m for mode in modes for m in run_mode(mode, config, args.duration)]
    extra = sys.argv[1:] if argv is None else argv
    command = "make bench" + (f" BENCH_ARGS='{' '.join(extra)}'" if extra else "")
    section = render(started, command, bare, results)
    print(section)
    if not args.no_write:
        write_section(args.out, "embeddings-v0", section)
        print(f"written to {args.out}", file=sys.stderr)
    failed = [m for m in results if m.mode == DEFAULT_MODE and not passes(m, bare)]
    sys.exit(1 if failed else 0)


def ratio(m: Measured, bare: dict[str, float]) -> float:
    return m.load.texts_per_s / bare["batch32_texts_per_s"]


def passes(m: Measured, bare: dict[str, float]) -> bool:
    batch_ok = m.scenario.texts_per_request > 1 or m.mean_batch >= 8
    return m.load.failures == 0 and ratio(m, bare) >= m.scenario.bar and batch_ok


def render(started: str, command: str, bare: dict[str, float], results: list[Measured]) -> str:
    lines = [
        f"Run {started} with `{command}` on {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}.",
        "",
        f"Bare model (`SentenceTransformer.encode`, {bare['torch_threads']} torch threads): "
        f"**{bare['batch32_texts_per_s']:.0f} texts/s** at batch 32, "
        f"{bare['batch1_texts_per_s']:.0f} texts/s one text at a time.",
        "",
        "| mode | load | req/s | texts/s | × bare | p50 ms | p95 ms | p99 ms "
        "| mean batch | failed | bar |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m in results:
        load = m.load
        mode = f"**{m.mode}** (default)" if m.mode == DEFAULT_MODE else m.mode
        verdict = "pass" if passes(m, bare) else "FAIL"
        bar = f"≥ {m.scenario.bar}×" + (", batch ≥ 8" if m.scenario.texts_per_request == 1 else "")
        lines.append(
            f"| {mode} | {m.scenario.concurrency} conns × {m.scenario.texts_per_request} text "
            f"| {load.req_per_s:.1f} | {load.texts_per_s:.0f} | {ratio(m, bare):.2f} "
            f"| {load.p50_ms:.0f} | {load.p95_ms:.0f} | {load.p99_ms:.0f} "
            f"| {m.mean_batch:.1f} | {load.failures} | {bar}: {verdict} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
