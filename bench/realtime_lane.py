"""What the realtime lane gives a single text, on the bare model, and what it costs the passes
beside it.

    python -m bench.realtime_lane [--seconds 8] [--precision f32]

MiniLM on OpenVINO as a replica builds it: the main forward on 2 threads, the lane's on 1
(backends/runtimes/lane.py). One thread runs passes of a given shape back to back; another
sends a single text every 30 ms, either waiting for the pass in progress (one model, one
pass at a time: the gate without a lane), on the same compiled model at once (the reason the
lane has a forward of its own), or on the lane's forward. Per setting, the single text's
p50 / p99 and the passes' texts a second.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.openvino_shapes import export
from deployments.backends.runtimes.build import openvino_forward

Forward = Callable[[dict[str, np.ndarray]], Any]
SINGLE = (1, 12)
PASSES = {"6 texts (128 tokens)": (6, 21), "49 texts (785 tokens)": (49, 16)}


def features(rows: int, length: int) -> dict[str, np.ndarray]:
    ids = np.ones((rows, length), dtype=np.int64)
    return {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "token_type_ids": np.zeros_like(ids),
    }


def trial(
    main: Forward, single: Forward | None, shape: tuple[int, int], seconds: float
) -> dict[str, float]:
    """`single`: the forward the single texts use beside the passes; None: they wait for
    the pass in progress and then run on `main`."""
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    rows = 0
    latencies: list[float] = []

    def passes() -> None:
        nonlocal rows
        batch = features(*shape)
        while time.monotonic() < stop:
            with lock:
                main(batch)
            rows += shape[0]

    def singles() -> None:
        text = features(*SINGLE)
        while time.monotonic() < stop:
            started = time.perf_counter()
            if single is None:
                with lock:
                    main(text)
            else:
                single(text)
            latencies.append(time.perf_counter() - started)
            time.sleep(0.03)

    threads = [threading.Thread(target=passes), threading.Thread(target=singles)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    latencies.sort()
    return {
        "single_p50_ms": round(1e3 * latencies[len(latencies) // 2], 1),
        "single_p99_ms": round(1e3 * latencies[int(0.99 * len(latencies))], 1),
        "pass_texts_per_s": round(rows / seconds, 1),
    }


def alone_ms(forward: Forward, shape: tuple[int, int], calls: int = 200) -> float:
    batch = features(*shape)
    forward(batch)
    took = []
    for _ in range(calls):
        started = time.perf_counter()
        forward(batch)
        took.append(time.perf_counter() - started)
    return round(1e3 * sorted(took)[calls // 2], 2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.realtime_lane")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--precision", default="f32", help="f32, or bf16 where the CPU has it")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        onnx = export(Path(directory))
        main_forward = openvino_forward(onnx, args.precision, threads=2)
        lane = openvino_forward(onnx, args.precision, threads=1)
        for shape in (SINGLE, *PASSES.values()):
            main_forward(features(*shape))
            lane(features(*shape))
        report: dict[str, Any] = {
            "single_alone_ms": {
                "2 threads": alone_ms(main_forward, SINGLE),
                "lane": alone_ms(lane, SINGLE),
            }
        }
        settings = {"waits for the pass": None, "same compiled model": main_forward, "lane": lane}
        for name, shape in PASSES.items():
            report[name] = {
                setting: trial(main_forward, single, shape, args.seconds)
                for setting, single in settings.items()
            }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
