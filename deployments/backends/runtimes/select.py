"""Put a model on the runtime its config names, or on the one `auto` measures fastest.

A model backend here is anything with `graph()`, `input_names`, `sample(n)` and a
settable `forward` (the sentence embedder and the cross-encoder). Runs on the replica's
model thread, so torch's thread count is the one the model will run with.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from deployments.backends.runtimes import auto as runtime_auto
from deployments.backends.runtimes import build as runtimes
from deployments.backends.runtimes import cache as runtime_cache
from deployments.backends.runtimes import choice as runtime_choice
from deployments.backends.runtimes import lane as realtime_lane
from deployments.backends.runtimes import passes as passes_choice
from deployments.backends.sources import default_cache_dir

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
    # How many forward passes may run at once, each on `threads // passes` threads, or
    # "auto": measured against one pass on every thread (backends/runtimes/passes.py).
    passes: int | str = 1
    # A forward of its own for the realtime lane's thread (backends/runtimes/lane.py);
    # "auto": on a CPU unless `fp32_only`.
    lane: bool | str = False


def torch_runtime(dtype: str, device: str) -> str:
    """The runtime `runtime: torch` means for a `dtype` field value."""
    if dtype == "auto":
        return "torch-fp16" if device.startswith("cuda") else "torch-fp32"
    return {"float32": "torch-fp32", "bfloat16": "torch-bf16", "float16": "torch-fp16"}[dtype]


def apply_runtime(
    model: Runnable, device: str, settings: RuntimeSettings, score_kind: str = "vector"
) -> dict[str, Any]:
    """Set `model.forward` from `settings`; returns what was chosen and why (for info()),
    with `passes_in_flight`: how many passes the forward is built to run at once."""
    graph = model.graph()
    # The weights' digest keys both kept choices; it reads every weight, so once at most.
    digest = functools.cache(lambda: runtimes.graph_key(graph))
    report = _apply_runtime(model, graph, digest, device, settings, score_kind)
    passes = _apply_passes(model, graph, digest, device, settings, report["runtime"], score_kind)
    lane = _apply_lane(model, graph, digest, device, settings, report["runtime"])
    return {**report, **passes, **lane}


def _apply_lane(
    model: Runnable,
    graph: torch.nn.Module,
    digest: Callable[[], str],
    device: str,
    settings: RuntimeSettings,
    runtime: str,
) -> dict[str, Any]:
    """Wraps `model.forward` in a `LaneRoutedForward` where the settings want a lane."""
    wanted = settings.lane
    if wanted == "auto":
        wanted = not device.startswith("cuda") and not settings.fp32_only
    if not wanted:
        return {"realtime_lane": None}
    threads = realtime_lane.lane_threads(settings.threads)
    lane = _forward_for(model, graph, digest, device, settings, runtime, 1, threads)
    model.forward = realtime_lane.LaneRoutedForward(model.forward, lane, threads)
    return {"realtime_lane": {"threads": threads}}


def _apply_runtime(
    model: Runnable,
    graph: torch.nn.Module,
    digest: Callable[[], str],
    device: str,
    settings: RuntimeSettings,
    score_kind: str,
) -> dict[str, Any]:
    name = settings.runtime
    if name == "torch":
        name = torch_runtime(settings.dtype, device)
        if name == "torch-fp16" and not device.startswith("cuda"):
            raise runtimes.RuntimeUnavailable(
                "dtype: float16 with runtime: torch needs a GPU (this replica runs on the "
                "CPU); use dtype: auto, float32 or bfloat16"
            )
    cache_dir = settings.cache_dir or default_cache_dir()
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
    sizes = _sizes(settings)
    candidates = [
        c
        for c in runtimes.auto_candidates(device)
        if not settings.fp32_only or c == runtime_choice.REFERENCE
    ]

    def build(n: str) -> runtimes.Forward:
        return runtimes.build_forward(
            n, graph, model.input_names, device, settings.threads, cache_dir, digest()
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

    key = _key(graph, digest(), score_kind, device, settings, sizes, candidates)
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


def _key(
    graph: torch.nn.Module,
    digest: str,
    score_kind: str,
    device: str,
    settings: RuntimeSettings,
    sizes: Sequence[int],
    candidates: Sequence[str],
) -> dict[str, Any]:
    return runtime_cache.cache_key(
        model={"graph": type(graph).__name__, "digest": digest, "score_kind": score_kind},
        hardware=runtime_cache.hardware(device, _gpu_name(device)),
        libraries=runtime_cache.library_versions(),
        threads=settings.threads,
        batch_sizes=sizes,
        min_agreement=settings.min_agreement,
        candidates=candidates,
        rounds=settings.rounds,
    )


def _sizes(settings: RuntimeSettings) -> list[int]:
    return sorted({int(s) for s in settings.batch_sizes if s > 0}) or [1]


def _apply_passes(
    model: Runnable,
    graph: torch.nn.Module,
    digest: Callable[[], str],
    device: str,
    settings: RuntimeSettings,
    runtime: str,
    score_kind: str,
) -> dict[str, Any]:
    """Rebuilds `model.forward` for several passes at once where settings ask for it or
    `auto` measures it faster; kept on disk beside the runtime's choice."""
    wanted, threads = settings.passes, max(1, settings.threads)

    def built_for(passes: int) -> runtimes.Forward:
        return _forward_for(model, graph, digest, device, settings, runtime, passes)

    if wanted != "auto":
        passes = max(1, int(wanted))
        if passes > 1:
            model.forward = built_for(passes)
        return {"passes_in_flight": passes, "passes_reason": "configured"}
    if device.startswith("cuda"):
        return {"passes_in_flight": 1, "passes_reason": "auto: one pass at a time on a GPU"}
    if threads < 2 or settings.fp32_only:
        why = "one thread" if threads < 2 else "memory_limit_mib is set"
        return {"passes_in_flight": 1, "passes_reason": f"auto: {why}"}
    sizes = _sizes(settings)
    key = _key(graph, digest(), score_kind, device, settings, sizes, [runtime])
    path = runtime_cache.cache_path(
        settings.cache_dir or default_cache_dir(), f"{type(graph).__name__}-passes", key
    )
    with runtime_auto.lock_or_not(path):
        kept, _ = runtime_cache.read(path, key)
        kept_passes = kept.report.get("passes_in_flight") if kept is not None else None
        if kept is not None and isinstance(kept_passes, int) and kept_passes >= 1:
            if kept_passes > 1:
                model.forward = built_for(kept_passes)
            return {**kept.report, "passes_decided": "kept"}
        side_by_side = built_for(threads)
        choice = passes_choice.choose_passes(
            model.forward,
            side_by_side,
            threads,
            threads,
            {s: model.sample(s) for s in sizes},
            torch.set_num_threads,
            rounds=settings.rounds,
        )
        if choice.passes > 1:
            model.forward = side_by_side
        report = {"runtime": runtime, **choice.report()}
        try:
            runtime_cache.write(path, key, runtime, report, datetime.now(UTC).isoformat())
        except OSError as exc:  # the next start measures again
            logger.warning("passes_in_flight auto: could not keep the choice: %s", exc)
        logger.info("passes_in_flight auto: %s", choice.reason)
        return {**report, "passes_decided": "measured"}


def _forward_for(
    model: Runnable,
    graph: torch.nn.Module,
    digest: Callable[[], str],
    device: str,
    settings: RuntimeSettings,
    runtime: str,
    passes: int,
    threads: int | None = None,
) -> runtimes.Forward:
    """The forward for `passes` at once on `threads` (default: the settings'): torch's is
    the model's own (each calling thread sets its thread count); the others are built
    with a stream per pass."""
    if runtimes.family(runtime) == "torch":
        return model.forward
    cache_dir = settings.cache_dir or default_cache_dir()
    return runtimes.build_forward(
        runtime,
        graph,
        model.input_names,
        device,
        settings.threads if threads is None else threads,
        cache_dir,
        digest(),
        streams=passes,
    )


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
        passes=getattr(config, "passes_in_flight", 1),
        lane=getattr(config, "realtime_lane", False),
    )
