"""A change against the commit before it, served side by side: `python -m bench.before_after REF`.

A refactor must not cost speed, and this machine's speed drifts over minutes, so the two
trees are measured in turns within one run: the default app of commit REF (checked out in a
temporary worktree) and of this checkout, each started as `make serve` starts it, then the
same closed-loop loads against each: 64 connections x 1 text and 8 x 32 texts of embeddings,
8 x 50-document reranks. The order flips every round (A B, B A, ...) so a slow drift loads
both sides alike; the medians of the per-round ratios (this checkout / REF) are printed and,
unless --no-write, kept in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.loadgen import LoadResult, embedding_bodies, run_closed_loop
from bench.report import write_section
from bench.rerank import workload
from bench.server import ROOT, load_config, running_server
from bench.texts import sentences

SETTLE_S = 10


@dataclass(frozen=True)
class Load:
    name: str
    path: str
    concurrency: int
    items_per_request: int
    bodies: list[bytes]


def loads(config: dict) -> list[Load]:
    args = config["applications"][0]["args"]
    embedder = args["embedding_models"][0]["name"]
    reranker = args["rerank_models"][0]["name"]
    texts = sentences(2000)
    rerank_bodies = [
        json.dumps({"model": reranker, "query": q, "documents": d}).encode()
        for q, d in workload(64, 50)
    ]
    return [
        Load(
            "embeddings 64 x 1", "/v1/embeddings", 64, 1, embedding_bodies(texts, 1, embedder, 500)
        ),
        Load(
            "embeddings 8 x 32", "/v1/embeddings", 8, 32, embedding_bodies(texts, 32, embedder, 60)
        ),
        Load("rerank 8 x 50 docs", "/v2/rerank", 8, 50, rerank_bodies),
    ]


@contextmanager
def checkout(ref: str) -> Iterator[Path]:
    """`ref` in a temporary git worktree, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="tributary-before-") as parent:
        path = Path(parent) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", str(path), ref], cwd=ROOT, check=True)
        try:
            yield path
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(path)], cwd=ROOT, check=False
            )


def measure(
    label: str, root: Path, config_name: str, work: list[Load], duration_s: float
) -> dict[str, LoadResult]:
    """Each tree serves its own default app: a config field added by the change would be
    refused by the tree before it."""
    results = {}
    config = load_config(root / config_name)
    with (
        tempfile.TemporaryDirectory() as workdir,
        running_server(config, Path(workdir), root=root) as server,
    ):
        time.sleep(SETTLE_S)
        for load in work:
            results[load.name] = asyncio.run(
                run_closed_loop(
                    "127.0.0.1",
                    server.port,
                    load.path,
                    load.bodies,
                    load.items_per_request,
                    load.concurrency,
                    duration_s,
                    progress=False,
                )
            )
            print(f"  {label}: {load.name}: {results[load.name].summary()}", file=sys.stderr)
    return results


Pairs = dict[str, tuple[LoadResult, LoadResult]]  # load name -> (before, after)


def render(ref: str, command: str, started: str, work: list[Load], rounds: list[Pairs]) -> str:
    lines = [
        f"Run {started}, `{command}`: commit {ref} (before) and this checkout (after),",
        f"the default app of each, {len(rounds)} rounds in turns. Medians over rounds; the ratio",
        "is after / before.",
        "",
        "| load | before items/s | after items/s | ratio | before p50 / p99 ms "
        "| after p50 / p99 ms | failures |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for load in work:
        pairs = [r[load.name] for r in rounds]
        before = statistics.median(b.texts_per_s for b, _ in pairs)
        after = statistics.median(a.texts_per_s for _, a in pairs)
        ratio = statistics.median(a.texts_per_s / b.texts_per_s for b, a in pairs if b.texts_per_s)
        b50 = statistics.median(b.p50_ms for b, _ in pairs)
        b99 = statistics.median(b.p99_ms for b, _ in pairs)
        a50 = statistics.median(a.p50_ms for _, a in pairs)
        a99 = statistics.median(a.p99_ms for _, a in pairs)
        failures = sum(b.failures + a.failures for b, a in pairs)
        lines.append(
            f"| {load.name} | {before:,.0f} | {after:,.0f} | {ratio:.2f}x | {b50:.1f} / {b99:.1f} "
            f"| {a50:.1f} / {a99:.1f} | {failures} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="the commit to compare with (e.g. main, HEAD~3)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=12.0, help="seconds per load run")
    parser.add_argument("--config", default="serve_config.yaml", help="in each checkout")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    extra = sys.argv[1:] if argv is None else argv
    command = "python -m bench.before_after " + " ".join(extra)
    work = loads(load_config(ROOT / args.config))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rounds: list[Pairs] = []
    with checkout(args.ref) as before_root:
        trees = {"before": before_root, "after": ROOT}
        for index in range(args.rounds):
            order = ["before", "after"] if index % 2 == 0 else ["after", "before"]
            print(f"round {index + 1}: {' then '.join(order)}", file=sys.stderr)
            measured = {
                label: measure(label, trees[label], args.config, work, args.duration)
                for label in order
            }
            rounds.append(
                {
                    load.name: (measured["before"][load.name], measured["after"][load.name])
                    for load in work
                }
            )
    section = render(args.ref, command, started, work, rounds)
    print(section)
    if not args.no_write:
        write_section(args.out, "before-after", section)


if __name__ == "__main__":
    main()
