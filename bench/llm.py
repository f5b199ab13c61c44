"""`make bench BENCH_ARGS='--scenarios llm'`: the continuous and the static generation
engine side by side, in one app, on a mixed workload of streamed completions.

One app start serves both engines: the default app's generation model twice,
`llm-continuous` (`engine: continuous`) and `llm-static` (`engine: static`), the same demo
weights and knobs; the rerankers are dropped and the (required) embedder is left idle, so
the LLMs have the machine. Only one engine is loaded at a time (the continuous manager's
idle thread waits on an event). Requests (bench/llm_workload.py): prompt length and
`max_tokens` each uniform in 8-256, seeded, greedy, `stream: true` with usage, so both
engines get the same work and TTFT is measured at the client (bench/sse_client.py).

1. Closed burst: 32 requests at once, per engine, `rounds` times (engines alternate
   first). The static engine's burst rate, in requests/s, is taken as its capacity.
2. Open loop: Poisson arrivals at fractions of that capacity, `duration` seconds each,
   per engine, alternating; every request is awaited, however late.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
import tempfile
import time
from pathlib import Path

import httpx

from bench.llm_plot import ttft_svg
from bench.llm_render import ENGINES, Run, median_summary, medians_by_rate, model_name, render
from bench.llm_workload import LlmRequest, StreamTiming, mixed_requests, poisson_arrivals, summarize
from bench.report import write_section
from bench.server import ROOT, Server, load_config, running_server
from bench.sse_client import completion_request, stream_completion

BURST = 32
SETTLE_S = 10
DEFAULT_FRACTIONS = (0.3, 0.6, 0.9, 1.2)


def bench_config(base: dict) -> dict:
    """The default app with its first generation model served by both engines."""
    config = copy.deepcopy(base)
    args = config["applications"][0]["args"]
    template = args["generation_models"][0]
    args["generation_models"] = [
        {**copy.deepcopy(template), "name": model_name(e), "engine": e} for e in ENGINES
    ]
    args["rerank_models"] = []
    for embedder in args["embedding_models"][:1]:  # the app needs one; keep it idle and small
        embedder["torch_threads"] = 1
        embedder["deployment"]["ray_actor_options"]["num_cpus"] = 0
    args["embedding_models"] = args["embedding_models"][:1]
    return config


def body(engine: str, request: LlmRequest) -> dict:
    return {
        "model": model_name(engine),
        "prompt": request.prompt,
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def replica_counter(server: Server, engine: str, name: str) -> int:
    stats = httpx.get(f"{server.url}/v1/stats", timeout=10).json()
    return int(stats["models"][model_name(engine)]["replica"].get(name, 0))


async def burst(server: Server, engine: str, requests: list[LlmRequest]) -> Run:
    encoded = [completion_request("127.0.0.1", server.port, body(engine, r)) for r in requests]
    batches = replica_counter(server, engine, "batches")  # the static engine's; 0 otherwise
    began = time.perf_counter()
    timings = await asyncio.gather(
        *(stream_completion("127.0.0.1", server.port, e, began) for e in encoded)
    )
    makespan = max((t.e2e_s for t in timings if t.ok), default=time.perf_counter() - began)
    batches = replica_counter(server, engine, "batches") - batches
    return Run(
        engine, None, summarize(timings, makespan), len(requests) / batches if batches else None
    )


async def open_loop(server: Server, engine: str, rate: float, duration_s: float, seed: int) -> Run:
    arrivals = poisson_arrivals(rate, duration_s, seed)
    requests = mixed_requests(len(arrivals), seed)
    encoded = [completion_request("127.0.0.1", server.port, body(engine, r)) for r in requests]
    start = time.perf_counter()
    tasks = []
    for offset, request in zip(arrivals, encoded, strict=True):
        due = start + offset
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        # Timed from when it was due, so a client running late charges that to the server.
        tasks.append(asyncio.create_task(stream_completion("127.0.0.1", server.port, request, due)))
    timings: list[StreamTiming] = await asyncio.gather(*tasks)
    # Tokens/s over the arrival window or until the last answer, whichever is longer: an
    # engine that falls behind is charged for its backlog.
    ends = [a + t.e2e_s for a, t in zip(arrivals, timings, strict=True) if t.ok]
    return Run(engine, rate, summarize(timings, max([duration_s, *ends])))


def measure(args: argparse.Namespace, config: dict) -> tuple[list[Run], list[Run], float]:
    bursts: list[Run] = []
    loops: list[Run] = []
    with (
        tempfile.TemporaryDirectory() as workdir,
        running_server(config, Path(workdir)) as server,
    ):
        time.sleep(SETTLE_S)
        work = mixed_requests(BURST, args.seed)
        for round_ in range(args.rounds):
            order = ENGINES if round_ % 2 == 0 else ENGINES[::-1]
            for engine in order:
                run = asyncio.run(burst(server, engine, work))
                print(f"burst {engine}: {run.summary}", file=sys.stderr)
                bursts.append(run)
        static = median_summary([r.summary for r in bursts if r.engine == "static"])
        mean_tokens = sum(r.max_tokens for r in work) / len(work)
        capacity = static.output_tokens_per_s / mean_tokens
        rates = args.rates or [round(f * capacity, 2) for f in args.fractions]
        print(f"static capacity ≈ {capacity:.2f} req/s; rates {rates}", file=sys.stderr)
        for i, rate in enumerate(rates):
            for round_ in range(args.rounds):
                order = ENGINES if (i + round_) % 2 == 0 else ENGINES[::-1]
                for engine in order:
                    seed = args.seed + 1000 * round_ + i
                    run = asyncio.run(open_loop(server, engine, rate, args.duration, seed))
                    print(f"open {rate}/s {engine}: {run.summary}", file=sys.stderr)
                    loops.append(run)
    return bursts, loops, capacity


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals")
    parser.add_argument(
        "--fractions",
        type=lambda s: [float(x) for x in s.split(",")],
        default=list(DEFAULT_FRACTIONS),
        help="arrival rates as fractions of the static engine's burst capacity",
    )
    parser.add_argument(
        "--rates", type=lambda s: [float(x) for x in s.split(",")], default=None,
        help="absolute arrival rates (req/s) instead of --fractions",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "llm-ttft.svg")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--command", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    command = args.command or "python -m bench.llm " + " ".join(argv or sys.argv[1:])
    config = bench_config(load_config(args.config))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    bursts, loops, capacity = measure(args, config)
    template = config["applications"][0]["args"]["generation_models"][0]
    section, met = render(started, command.strip(), template, args, bursts, loops, capacity)
    print(section)
    if not args.no_write:
        write_section(args.out, "llm", section)
        series = {
            e: [(r.rate_per_s or 0.0, r.summary.ttft_p99_ms) for r in medians_by_rate(loops, e)]
            for e in ENGINES
        }
        title = f"TTFT p99, mixed 8–256 token requests, {started}"
        args.plot.write_text(ttft_svg(title, series))
        print(f"written to {args.out} and {args.plot}", file=sys.stderr)
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
