"""The LLM benchmark's results: medians over rounds, the markdown section for
docs/benchmarks.md, and the verdict on the issue's bar (pure; no HTTP here)."""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
from dataclasses import dataclass, fields

from bench.llm_workload import Summary

ENGINES = ("continuous", "static")
# "Near capacity": the arrival rates at or above this fraction of the static capacity.
NEAR_CAPACITY = 0.85
TTFT_BAR = 0.5  # continuous TTFT p99 at most this times the static one ...
# ... at equal or higher output tokens/s. Both engines get the same arrivals, so below
# capacity both deliver the offered tokens; "equal" allows this much noise.
TOKENS_TOLERANCE = 0.97


KNOBS = (
    "max_num_seqs",
    "max_batch_tokens",
    "kv_cache_tokens",
    "page_size",
    "scheduler",
    "torch_threads",
    "static_batch_wait_s",
)


def model_name(engine: str) -> str:
    return f"llm-{engine}"


@dataclass
class Run:
    engine: str
    rate_per_s: float | None  # None: the closed burst
    summary: Summary
    mean_batch: float | None = None  # the static engine's requests per batch (burst)


def median_summary(summaries: list[Summary]) -> Summary:
    values = {
        f.name: statistics.median(getattr(s, f.name) for s in summaries) for f in fields(Summary)
    }
    return Summary(**values)


def medians_by_rate(loops: list[Run], engine: str) -> list[Run]:
    rates = sorted({r.rate_per_s for r in loops if r.rate_per_s is not None})
    out = []
    for rate in rates:
        same = [r.summary for r in loops if r.engine == engine and r.rate_per_s == rate]
        if same:
            out.append(Run(engine, rate, median_summary(same)))
    return out


def verdict(loops: list[Run], capacity: float) -> list[tuple[float, float, float, bool]]:
    """Per near-capacity rate: (rate, TTFT p99 ratio, tokens/s ratio, met)."""
    cont = {r.rate_per_s: r.summary for r in medians_by_rate(loops, "continuous")}
    stat = {r.rate_per_s: r.summary for r in medians_by_rate(loops, "static")}
    out = []
    for rate in sorted(set(cont) & set(stat)):
        if rate is None or rate < NEAR_CAPACITY * capacity:
            continue
        c, s = cont[rate], stat[rate]
        ttft = c.ttft_p99_ms / s.ttft_p99_ms if s.ttft_p99_ms else math.nan
        tokens = c.output_tokens_per_s / s.output_tokens_per_s if s.output_tokens_per_s else 0
        out.append((rate, ttft, tokens, ttft <= TTFT_BAR and tokens >= TOKENS_TOLERANCE))
    return out


def _row(load: str, run: Run) -> str:
    s = run.summary
    return (
        f"| {run.engine} | {load} | {s.requests:.0f} | {s.ok:.0f} | {s.refused:.0f} "
        f"| {s.failed:.0f} | {s.output_tokens_per_s:.0f} | {s.ttft_p50_ms:.0f} "
        f"| {s.ttft_p99_ms:.0f} | {s.e2e_p50_ms:.0f} | {s.e2e_p99_ms:.0f} "
        f"| {s.per_token_p50_ms:.1f} |"
    )


def render(
    started: str,
    command: str,
    model: dict,
    args: argparse.Namespace,
    bursts: list[Run],
    loops: list[Run],
    capacity: float,
) -> tuple[str, bool]:
    knobs = ", ".join(f"{k} {model[k]}" for k in KNOBS if k in model)
    lines = [
        f"Run {started} with `{command}` on {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}: model `{model['source']}` served twice in one "
        f"app, `llm-continuous` and `llm-static`, each with {knobs}. Medians of "
        f"{args.rounds} round(s); latencies in ms, from when a request was due to its first "
        "token event (TTFT) and to `data: [DONE]` (e2e); per-token = (e2e − TTFT) / "
        "(tokens − 1), median over requests.",
        "",
        "| engine | load | requests | ok | refused | failed | output tokens/s | TTFT p50 "
        "| TTFT p99 | e2e p50 | e2e p99 | per-token ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for engine in ENGINES:
        runs = [r.summary for r in bursts if r.engine == engine]
        if runs:
            lines.append(
                _row(f"burst of {runs[0].requests:.0f}", Run(engine, None, median_summary(runs)))
            )
    rates = sorted({r.rate_per_s for r in loops if r.rate_per_s is not None})
    by_engine = {e: {r.rate_per_s: r for r in medians_by_rate(loops, e)} for e in ENGINES}
    for rate in rates:
        for engine in ENGINES:
            run = by_engine[engine].get(rate)
            if run is not None:
                lines.append(_row(f"{rate:g}/s ({rate / capacity:.2f}×)", run))
    static_batches = [r.mean_batch for r in bursts if r.mean_batch is not None]
    checks = verdict(loops, capacity)
    met = bool(checks) and all(ok for *_, ok in checks)
    lines += [
        "",
        f"Static capacity from its burst: {capacity:.2f} requests/s (burst output tokens/s over "
        f"the mean `max_tokens` of the burst); open-loop rates are fractions of it, "
        f"{args.duration:g} s of Poisson arrivals each.",
        "",
        "The static engine's burst went out in batches of "
        + ", ".join(f"{b:.1f}" for b in static_batches)
        + " requests on average (per round): `@serve.batch` starts a batch once "
        "`static_batch_wait_s` has passed after its first request, and the rest wait for it.",
        "",
        "Bar (issue 7): near capacity (≥ "
        f"{NEAR_CAPACITY:g}× it), continuous TTFT p99 ≤ {TTFT_BAR:g}× static at equal "
        f"(≥ {TOKENS_TOLERANCE:g}×) or higher output tokens/s: "
        + "; ".join(
            f"{rate:g}/s: TTFT p99 {ttft:.3f}×, tokens/s {tokens:.2f}× "
            f"({'met' if ok else 'missed'})"
            for rate, ttft, tokens, ok in checks
        )
        + f". **{'met' if met else 'not met'}**.",
        "",
        "![TTFT p99 against arrival rate](llm-ttft.svg)",
    ]
    return "\n".join(lines), met
