"""`make bench`, rerank part: pairs/s of the served reranker against its bare backend.

The default app's reranker (serve_config.yaml, `rerank_models[0]`) is started as
`make serve` starts it; then, for a few rounds: the bare backend (the same scorer class
the deployment loads, tokenizing and scoring the same query-document pairs in batches of
the deployment's normal-class `max_batch_size`) with the server idle, followed at once by
closed-loop load of 8 concurrent requests x 50 documents on `POST /v2/rerank`, first as
`X-Priority: batch` (bulk scoring, whose 30 s target admits it all: what the serving path
gets out of the model), then without the header (normal class, 500 ms target: on a small CPU
this load queues more than that, and admission refuses the excess). The median of the
batch-class ratios is checked against the bar (0.85x); both are written to
docs/benchmarks.md between the `rerank` markers.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.loadgen import LoadResult, refused_share, run_closed_loop
from bench.report import write_section
from bench.server import ROOT, load_config, running_server
from bench.texts import sentences
from deployments.backends.encoders.pair_scorer import PairScorer
from deployments.config import RerankModelConfig
from deployments.launch.main import DEFAULT_MODE
from deployments.replicas.batched.reranker import load_scorer

BAR = 0.85
SETTLE_S = 10


@dataclass
class Round:
    bare_pairs_per_s: float
    load: LoadResult  # batch class: the bar
    normal: LoadResult  # the same clients without X-Priority

    @property
    def ratio(self) -> float:
        return self.load.texts_per_s / self.bare_pairs_per_s

    @property
    def normal_ratio(self) -> float:
        return self.normal.texts_per_s / self.bare_pairs_per_s


def workload(n_requests: int, docs: int) -> list[tuple[str, list[str]]]:
    texts = sentences(n_requests * (docs + 1))
    return [
        (texts[i * (docs + 1)], texts[i * (docs + 1) + 1 : (i + 1) * (docs + 1)])
        for i in range(n_requests)
    ]


def bare_pairs_per_s(
    scorer: PairScorer,
    work: list[tuple[str, list[str]]],
    batch: int,
    duration_s: float,
    passes: int = 1,
    threads: int = 2,
) -> float:
    """Tokenize each request's query and documents and score its pairs, `batch` pairs a
    pass (a pass may span requests, as the deployment's batches do); `passes` loops side
    by side, `threads // passes` torch threads each, as the replica runs them."""

    def pass_over(start: int) -> int:
        pairs = []
        for query, docs in work[start : start + 4]:
            q, *ds = scorer.tokenize([query, *docs])
            pairs += [(q[: scorer.max_query_tokens], d) for d in ds]
        for i in range(0, len(pairs), batch):
            scorer.score(pairs[i : i + batch])
        return len(pairs)

    def loop(first: int, until: float) -> int:
        done, start = 0, first
        while time.perf_counter() < until:
            done += pass_over(start)
            start = (start + 4) % len(work)
        return done

    each = max(1, threads // passes)
    with ThreadPoolExecutor(passes, initializer=torch.set_num_threads, initargs=(each,)) as pool:
        for future in [pool.submit(pass_over, 4 * n) for n in range(passes)]:  # warm up
            future.result()
        began = time.perf_counter()
        loops = [pool.submit(loop, (8 * n) % len(work), began + duration_s) for n in range(passes)]
        done = sum(future.result() for future in loops)
        return done / (time.perf_counter() - began)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per load run")
    parser.add_argument("--bare-duration", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--documents", type=int, default=50, help="documents per request")
    parser.add_argument("--config", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument(
        "--runtime",
        default=None,
        help="serve the reranker on this runtime (docs/backends.md) and compare with its "
        "bare backend on the same one; prints only",
    )
    args = parser.parse_args(argv)
    extra = sys.argv[1:] if argv is None else argv
    command = "python -m bench.rerank" + (f" {' '.join(extra)}" if extra else "")

    config = load_config(args.config)
    if args.runtime is not None:
        config["applications"][0]["args"]["rerank_models"][0]["runtime"] = args.runtime
        args.no_write = True  # not the published torch section
    model = RerankModelConfig.model_validate(config["applications"][0]["args"]["rerank_models"][0])
    if model.torch_threads:
        torch.set_num_threads(model.torch_threads)
    threads = torch.get_num_threads()
    scorer, report = load_scorer(model, "cpu", threads)
    passes = int(report["passes_in_flight"])
    batch = model.batching.normal.max_batch_size
    work = workload(64, args.documents)
    bodies = [
        json.dumps({"model": model.name, "query": q, "documents": d}).encode() for q, d in work
    ]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rounds: list[Round] = []
    with (
        tempfile.TemporaryDirectory() as workdir,
        running_server(config, Path(workdir), mode=DEFAULT_MODE) as server,
    ):
        time.sleep(SETTLE_S)
        for index in range(args.rounds):
            bare = bare_pairs_per_s(scorer, work, batch, args.bare_duration, passes, threads)
            print(f"round {index + 1}: bare {bare:.0f} pairs/s", file=sys.stderr)
            loads = [
                asyncio.run(
                    run_closed_loop(
                        "127.0.0.1",
                        server.port,
                        "/v2/rerank",
                        bodies,
                        args.documents,
                        args.concurrency,
                        args.duration,
                        headers=headers,
                    )
                )
                for headers in ({"X-Priority": "batch"}, None)
            ]
            rounds.append(Round(bare, *loads))
    section = render(started, command, model, args, batch, rounds)
    print(section)
    if not args.no_write:
        write_section(args.out, "rerank", section)
    sys.exit(0 if passes(rounds) else 1)


def passes(rounds: list[Round]) -> bool:
    """The batch-class median at the bar, and no error in either class."""
    errors = sum(r.load.errors + r.normal.errors for r in rounds)
    return statistics.median(r.ratio for r in rounds) >= BAR and not errors


def render(
    started: str,
    command: str,
    model: RerankModelConfig,
    args: argparse.Namespace,
    batch: int,
    rounds: list[Round],
) -> str:
    def median(values: list[float]) -> float:
        return statistics.median(values)

    bare = median([r.bare_pairs_per_s for r in rounds])

    def row(label: str, loads: list[LoadResult], ratios: list[float], bar: str) -> str:
        return (
            f"| {label} | {bare:.0f} | {median([x.texts_per_s for x in loads]):.0f} "
            f"| {median(ratios):.2f} | {median([x.req_per_s for x in loads]):.1f} "
            f"| {median([x.p50_ms for x in loads]):.0f} | {median([x.p95_ms for x in loads]):.0f} "
            f"| {refused_share(loads):.0%} | {sum(x.errors for x in loads)} | {bar} |"
        )

    verdict = f"≥ {BAR}×: {'pass' if passes(rounds) else 'FAIL'}"
    return "\n".join(
        [
            f"Run {started} with `{command}` on {platform.machine()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}: reranker `{model.name}` ({model.backend}), "
            f"mode {DEFAULT_MODE}. Each round: the bare backend (tokenize + score, "
            f"{batch} pairs a pass) with the server idle, then {args.concurrency} concurrent "
            f"requests x {args.documents} documents on `POST /v2/rerank`, as `X-Priority: "
            "batch` and then without it (normal class); medians of "
            f"{len(rounds)} rounds. A refused client (429/503) waits its Retry-After; "
            "*refused* is the share of answers that were such refusals.",
            "",
            "| class | bare pairs/s | served pairs/s | × bare | req/s | p50 ms | p95 ms "
            "| refused | failed | bar |",
            "|---|---|---|---|---|---|---|---|---|---|",
            row("batch", [r.load for r in rounds], [r.ratio for r in rounds], verdict),
            row("normal", [r.normal for r in rounds], [r.normal_ratio for r in rounds], "—"),
            "",
            "Per round, × bare: batch "
            + ", ".join(f"{r.ratio:.2f}" for r in rounds)
            + "; normal "
            + ", ".join(f"{r.normal_ratio:.2f}" for r in rounds)
            + ".",
        ]
    )


if __name__ == "__main__":
    main()
