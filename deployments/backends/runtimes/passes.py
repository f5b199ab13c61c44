"""`passes_in_flight: auto`: one forward pass on every thread, or one pass per thread?

On a small CPU a pass of a small model does not keep its threads busy (tokens in one row
depend on each other, and a short batch leaves cores waiting on the slowest), so two
passes side by side, one thread each, often finish more texts a second than one pass on
two threads: 1.4-2x for MiniLM at batch 1-32 on a 2-core Xeon (docs/benchmarks.md). On
another CPU, or another model, it may not: so it is measured, at the batch sizes the
replica runs, in interleaved rounds, and kept only when it is clearly faster.

Pure timing logic: the forwards and how a thread gets its torch thread count come in.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

Forward = Callable[[Any], np.ndarray]
# Side-by-side passes are kept only when they save at least this share of the time a text
# takes: a tie keeps the simpler single pass (and its shorter lone-request latency).
MIN_GAIN = 1.05


@dataclass
class PassesChoice:
    passes: int
    texts_per_s: dict[int, dict[int, float]]  # passes -> batch size -> texts/s
    reason: str

    def report(self) -> dict[str, Any]:
        return {
            "passes_in_flight": self.passes,
            "passes_reason": self.reason,
            "passes_texts_per_s": {
                str(n): {str(s): round(r, 1) for s, r in sorted(by.items())}
                for n, by in sorted(self.texts_per_s.items())
            },
        }


def choose_passes(
    single: Forward,
    side_by_side: Forward,
    passes: int,
    threads: int,
    batches: Mapping[int, Any],
    set_threads: Callable[[int], None],
    rounds: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> PassesChoice:
    """Times `single` (one pass at a time on `threads` threads) against `side_by_side`
    (`passes` passes at once, `threads // passes` threads each) on `batches`."""
    each = max(1, threads // passes)
    samples: dict[int, dict[int, list[float]]] = {1: {}, passes: {}}
    with (
        ThreadPoolExecutor(1, initializer=set_threads, initargs=(threads,)) as alone,
        ThreadPoolExecutor(passes, initializer=set_threads, initargs=(each,)) as together,
    ):
        # Round 0 is untimed: first calls at a shape pay one-off set-up costs.
        for round_ in range(max(1, rounds) + 1):
            for size, batch in batches.items():
                took = _timed(alone, single, batch, 1, clock)
                if round_:
                    samples[1].setdefault(size, []).append(took)
                took = _timed(together, side_by_side, batch, passes, clock)
                if round_:
                    samples[passes].setdefault(size, []).append(took)
    rates = {
        n: {size: n * size / statistics.median(times) for size, times in by_size.items()}
        for n, by_size in samples.items()
    }
    gain = _seconds_per_text(rates[1]) / _seconds_per_text(rates[passes])
    sizes = ", ".join(str(s) for s in sorted(batches))
    if gain >= MIN_GAIN:
        reason = (
            f"{passes} passes side by side, {each} thread(s) each: {gain:.2f}x one pass on "
            f"{threads} threads, measured at batch sizes {sizes}"
        )
        return PassesChoice(passes, rates, reason)
    reason = (
        f"one pass on {threads} threads: {passes} side by side measured {gain:.2f}x "
        f"(kept below {MIN_GAIN}x) at batch sizes {sizes}"
    )
    return PassesChoice(1, rates, reason)


def _timed(
    pool: ThreadPoolExecutor, forward: Forward, batch: Any, calls: int, clock: Callable[[], float]
) -> float:
    start = clock()
    for future in [pool.submit(forward, batch) for _ in range(calls)]:
        future.result()
    return max(clock() - start, 1e-9)


def _seconds_per_text(rates: Mapping[int, float]) -> float:
    return sum(1.0 / rate for rate in rates.values())
