"""Put a model on the runtime its config names, or on the one `auto` measures fastest.

A model backend here is anything with `graph()`, `input_names`, `sample(n)` and a
settable `forward` (the sentence embedder and the cross-encoder). Runs on the replica's
model thread, so torch's thread count is the one the model will run with.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from deployments.backends import runtime_auto, runtime_cache, runtime_choice, runtimes
from deployments.backends.demo_llm import default_cache_dir

logger = logging.getLogger(__name__)

AUTO_ROUNDS = 3
# Rows of the probe a kept choice is re-checked on at start (every distinct sample text).
RECHECK_ROWS = 16


class Runnable(Protocol):
    input_names: list[str]
    forward: runtimes.Forward

    def graph(self) -> torch.nn.Module: ...

    def sample(self, size: int) -> runtimes.Features: ...


@dataclass
class RuntimeSettings:
    runtime: str  # "torch" (by `dtype`), "auto", or one of runtimes.RUNTIMES
    dtype: str = "auto"  # the `dtype` field, for runtime "torch"
    min_agreement: float = 0.999
    batch_sizes: Sequence[int] = (1, 32)
    threads: int = 1
    cache_dir: Path | None = None
    rounds: int = AUTO_ROUNDS
    # `memory_limit_mib` is set: only torch fp32 is known to fail cleanly, input by input,
    # at an address-space limit (OpenVINO was seen to return its previous, smaller output
    # instead; torch bf16 failed single inputs that fit in fp32), so `auto` keeps to it.
    fp32_only: bool = False


def torch_runtime(dtype: str, device: str) -> str:
    """The runtime `runtime: torch` means for a `dtype` field value."""
    if dtype == "auto":
        return "torch-fp16" if device.startswith("cuda") else "torch-fp32"
    return {"float32": "torch-fp32", "bfloat16": "torch-bf16", "float16": "torch-fp16"}[dtype]


def apply_runtime(
    model: Runnable, device: str, settings: RuntimeSettings, score_kind: str = "vector"
) -> dict[str, Any]:
    """Set `model.forward` from `settings`; returns what was chosen and why (for info())."""
    name = settings.runtime
    if name == "torch":
        name = torch_runtime(settings.dtype, device)
        if name == "torch-fp16" and not device.startswith("cuda"):
            raise runtimes.RuntimeUnavailable(
                "dtype: float16 with runtime: torch needs a GPU (this replica runs on the "
                "CPU); use dtype: auto, float32 or bfloat16"
            )
    cache_dir = settings.cache_dir or default_cache_dir()
    graph = model.graph()
    if name != "auto":
        runtimes.check_available(name, device)
        # torch fp32 is what the model already runs. Another torch precision casts the
        # model in place (no second copy in memory); other runtimes are built.
        if runtimes.family(name) == "torch":
            if name != "torch-fp32":
                model.forward = runtimes.TorchForward(graph, device, _dtype(name), copy=False)
        else:
            model.forward = runtimes.build_forward(
                name, graph, model.input_names, device, settings.threads, cache_dir
            )
        report: dict[str, Any] = {
            "runtime": name,
            "reason": f"configured (runtime: {settings.runtime})",
            "summary": "configured",
        }
        logger.info("runtime %s: %s", name, report["reason"])
        return report
    agreement = runtime_choice.min_cosine if score_kind == "vector" else _scores_agree
    sizes = sorted({int(s) for s in settings.batch_sizes if s > 0}) or [1]
    candidates = [
        c
        for c in runtimes.auto_candidates(device)
        if not settings.fp32_only or c == runtime_choice.REFERENCE
    ]

    digest = runtimes.graph_key(graph)

    def build(n: str) -> runtimes.Forward:
        return runtimes.build_forward(
            n, graph, model.input_names, device, settings.threads, cache_dir, digest
        )

    def measure() -> runtime_choice.Choice:
        return runtime_choice.choose(
            candidates,
            build,
            probe=model.sample(max(16, *sizes)),
            batches={s: model.sample(s) for s in sizes},
            agreement=agreement,
            min_agreement=settings.min_agreement,
            rounds=settings.rounds,
        )

    key = runtime_cache.cache_key(
        model={
            "graph": type(graph).__name__,
            "digest": digest,
            "score_kind": score_kind,
        },
        hardware=runtime_cache.hardware(device, _gpu_name(device)),
        libraries=runtime_cache.library_versions(),
        threads=settings.threads,
        batch_sizes=sizes,
        min_agreement=settings.min_agreement,
        candidates=candidates,
        rounds=settings.rounds,
    )
    path = runtime_cache.cache_path(cache_dir, type(graph).__name__, key)
    model.forward, report = runtime_auto.keep_or_measure(
        key,
        path,
        build,
        measure,
        probe=model.sample(RECHECK_ROWS),
        agreement=agreement,
        min_agreement=settings.min_agreement,
    )
    return report


def _gpu_name(device: str) -> str | None:
    return torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None


def _scores_agree(candidate: np.ndarray, reference: np.ndarray) -> float:
    return runtime_choice.score_correlation(candidate, reference)


def _dtype(name: str) -> torch.dtype:
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[
        name.split("-")[1]
    ]


def settings_from(config: Any, threads: int) -> RuntimeSettings:
    """RuntimeSettings from an embedding or rerank model's config (duck-typed: backends
    import no config); `auto` times batches of 1 and of each class's largest size."""
    sizes = {1} | {
        int(config.batching.of(p).max_batch_size) for p in ("realtime", "normal", "batch")
    }
    return RuntimeSettings(
        runtime=config.runtime,
        dtype=config.dtype,
        min_agreement=config.runtime_min_agreement,
        batch_sizes=sorted(sizes),
        threads=threads,
        cache_dir=Path(config.cache_dir) if config.cache_dir else None,
        fp32_only=getattr(config, "memory_limit_mib", None) is not None,
    )
