"""Per-sequence sampling that both engines share: temperature, top-p and a seed per request.

Transformers' continuous-batching manager samples every sequence of a step from one random
stream and switches sampling on or off for the whole manager, so a greedy request and a
sampled one could not share a batch and `seed` could not be honoured. Here sampling happens
in a logits processor instead: each sampled row draws its token from its own seeded
generator and leaves only that token finite; the engine then takes the argmax, which for a
greedy row (temperature 0) is plain greedy decoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def generator(self) -> torch.Generator:
        generator = torch.Generator()
        if self.seed is not None:
            generator.manual_seed(self.seed)
        else:
            generator.seed()
        return generator


@dataclass
class RowSampler:
    """One sequence's sampling state; its generator advances one draw per token."""

    params: SamplingParams
    generator: torch.Generator

    @classmethod
    def of(cls, params: SamplingParams) -> RowSampler:
        return cls(params, params.generator())


def sample_rows(scores: torch.Tensor, rows: list[RowSampler | None]) -> torch.Tensor:
    """`scores` [n, vocab] with row i sampled by `rows[i]` (None or greedy: untouched).
    A sampled row comes back with its drawn token at 0 and every other one at -inf."""
    for i, row in enumerate(rows):
        if row is None or row.params.greedy:
            continue
        logits = scores[i].float() / row.params.temperature
        probs = torch.softmax(logits, dim=-1)
        if row.params.top_p < 1.0:
            probs = _top_p(probs, row.params.top_p)
        token = int(torch.multinomial(probs, 1, generator=row.generator))
        scores[i].fill_(float("-inf"))
        scores[i, token] = 0.0
    return scores


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The smallest set of most likely tokens whose mass reaches `top_p`, renormalised."""
    sorted_probs, order = torch.sort(probs, descending=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs[before >= top_p] = 0.0  # the first token always stays (before = 0)
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return kept / kept.sum()
