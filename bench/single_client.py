"""What the serving path adds for one client alone: served latency of one text at a time
against the bare model's batch-1 time on the same runtime, in paired rounds.

    python -m bench.single_client [--runtime torch] [--rounds 3] [--duration 10] [--fixed]

Each round times the bare model (tokenising included, as a replica does) on single texts
with the server idle, then sends single-text requests from one connection for `--duration`
seconds. The added cost is served p50 minus bare p50, in ms (issue goal: <= 3 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench import bare_runtime
from bench.loadgen import embedding_bodies, run_closed_loop
from bench.server import ROOT, load_config, running_server
from bench.texts import sentences
from deployments.backends.encoders.sentence_embedder import SentenceEmbedder

MODEL = "all-MiniLM-L6-v2"


def bare_p50_ms(embedder: SentenceEmbedder, texts: list[str], n: int) -> float:
    for text in texts[:10]:  # warm-up
        embedder.embed([embedder.window.wrap(embedder.tokenize([text])[0])[0]])
    times = []
    for text in texts[:n]:
        started = time.perf_counter()
        embedder.embed([embedder.window.wrap(embedder.tokenize([text])[0])[0]])
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="torch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument(
        "--priority", default=None, help="X-Priority of the requests (default: the server's)"
    )
    parser.add_argument("--config", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument(
        "--fixed",
        action="store_true",
        help="adaptive: false, the batch numbers as configured (a lone request waits out "
        "its class's batch window)",
    )
    args = parser.parse_args(argv)
    config = copy.deepcopy(load_config(args.config))
    models = config["applications"][0]["args"]["embedding_models"]
    for model in models:
        model["runtime"] = args.runtime
        model.setdefault("batching", {})["adaptive"] = not args.fixed
    embedder, report = bare_runtime.load(args.runtime, int(models[0]["torch_threads"]))
    print(f"bare model: {report}", file=sys.stderr)
    texts = sentences(400)
    rows = []
    with tempfile.TemporaryDirectory() as workdir, running_server(config, Path(workdir)) as server:
        time.sleep(10)  # Ray keeps starting helper processes for a few seconds
        for index in range(args.rounds):
            bare = bare_p50_ms(embedder, texts, 200)
            load = asyncio.run(
                run_closed_loop(
                    "127.0.0.1",
                    server.port,
                    "/v1/embeddings",
                    embedding_bodies(texts, 1, MODEL, 256),
                    1,
                    1,
                    args.duration,
                    progress=False,
                    headers={"X-Priority": args.priority} if args.priority else None,
                )
            )
            served = statistics.median(load.latencies_s) * 1000
            rows.append((bare, served, served - bare, load.failures))
            print(f"round {index + 1}: bare {bare:.2f} ms, served {served:.2f} ms", file=sys.stderr)
    flags = (f" --priority {args.priority}" if args.priority else "") + (
        " --fixed" if args.fixed else ""
    )
    print(f"# python -m bench.single_client --runtime {args.runtime} --rounds {args.rounds}{flags}")
    print("| round | bare batch-1 p50 ms | served p50 ms, 1 client | added ms | failed |")
    print("|---|---|---|---|---|")
    for i, (bare, served, added, failed) in enumerate(rows, 1):
        print(f"| {i} | {bare:.2f} | {served:.2f} | {added:.2f} | {failed} |")
    added_median = statistics.median(r[2] for r in rows)
    print(f"median added: {added_median:.2f} ms ({report['runtime']})")


if __name__ == "__main__":
    main()
