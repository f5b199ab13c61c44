"""The pure parts of the LLM benchmark: the mixed workload, Poisson arrivals, percentiles,
and per-request stream timings. No HTTP and no model here, so unit tests cover them.

A request is a prompt of `prompt_words` words (one token each with the demo model's
word-level tokenizer, plus BOS) and a `max_tokens`, both drawn uniformly from 8-256 with
a seeded generator, so both engines get exactly the same requests in the same order.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.texts import sentences

MIN_TOKENS = 8
MAX_TOKENS = 256


@dataclass(frozen=True)
class LlmRequest:
    prompt: str
    prompt_words: int
    max_tokens: int


def _word_pool(seed: int) -> list[str]:
    # Bare lowercase words: punctuation would be a token of its own.
    return [w.strip(".").lower() for s in sentences(400, seed) for w in s.split()]


def mixed_requests(
    n: int, seed: int = 0, low: int = MIN_TOKENS, high: int = MAX_TOKENS
) -> list[LlmRequest]:
    """`n` requests with prompt length and max_tokens each uniform in [low, high]."""
    rng = random.Random(seed)
    pool = _word_pool(seed)
    out = []
    for _ in range(n):
        words, max_tokens = rng.randint(low, high), rng.randint(low, high)
        start = rng.randrange(len(pool) - words)
        out.append(LlmRequest(" ".join(pool[start : start + words]), words, max_tokens))
    return out


def poisson_arrivals(rate_per_s: float, duration_s: float, seed: int = 0) -> list[float]:
    """Arrival offsets (seconds from the start, ascending) of a Poisson process of
    `rate_per_s` over `duration_s`: exponential gaps, seeded."""
    if rate_per_s <= 0 or duration_s <= 0:
        raise ValueError("need a positive rate and duration")
    rng = random.Random(seed)
    out: list[float] = []
    t = rng.expovariate(rate_per_s)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate_per_s)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile `q` (0-100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass
class StreamTiming:
    """One streamed request as the client saw it; times in seconds from when it was due
    (open loop) or sent (burst)."""

    status: int
    ttft_s: float = math.nan  # first `data:` event carrying a choice
    e2e_s: float = math.nan  # `data: [DONE]`
    completion_tokens: int = 0  # from the usage chunk
    chunk_times_s: list[float] = field(default_factory=list)  # every choice event

    @property
    def ok(self) -> bool:
        return self.status == 200 and not math.isnan(self.e2e_s)

    @property
    def per_token_s(self) -> float:
        """Decode time per token after the first: (e2e - ttft) / (tokens - 1)."""
        if not self.ok or self.completion_tokens < 2:
            return math.nan
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)


@dataclass(frozen=True)
class Summary:
    requests: int
    ok: int
    refused: int  # 429 / 503: the server said no
    failed: int  # anything else that did not complete
    output_tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    e2e_p50_ms: float
    e2e_p99_ms: float
    per_token_p50_ms: float


def summarize(timings: Sequence[StreamTiming], seconds: float) -> Summary:
    """Tokens/s over `seconds` (the burst's makespan, or the open loop's time from the
    first arrival to the last completion)."""
    ok = [t for t in timings if t.ok]
    refused = sum(t.status in (429, 503) for t in timings)
    per_token = [t.per_token_s for t in ok if not math.isnan(t.per_token_s)]
    ms = 1000.0
    return Summary(
        requests=len(timings),
        ok=len(ok),
        refused=refused,
        failed=len(timings) - len(ok) - refused,
        output_tokens_per_s=sum(t.completion_tokens for t in ok) / seconds if seconds else 0.0,
        ttft_p50_ms=percentile([t.ttft_s for t in ok], 50) * ms,
        ttft_p99_ms=percentile([t.ttft_s for t in ok], 99) * ms,
        e2e_p50_ms=percentile([t.e2e_s for t in ok], 50) * ms,
        e2e_p99_ms=percentile([t.e2e_s for t in ok], 99) * ms,
        per_token_p50_ms=(statistics.median(per_token) * ms) if per_token else math.nan,
    )
