"""Per-sequence sampling that both engines share: temperature, top-p and a seed per request.

Transformers' continuous-batching manager samples every sequence of a step from one random
stream and switches sampling on or off for the whole manager, so a greedy request and a
sampled one could not share a batch and `seed` could not be honoured. Here sampling happens
in a logits processor instead: each sampled row draws its token from its own seeded
generator and leaves only that token finite; the engine then takes the argmax, which for a
greedy row (temperature 0) is plain greedy decoding.

Every value the API admits must be safe here, because this runs on the engine's own thread
where one exception used to stop generation for everyone: a temperature too small to
divide by is greedy (its limit), top-p keeps at least the most likely token however small
it is, and a row whose probabilities come out non-finite falls back to its argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from deployments.core.generation_key import is_greedy

_SEED_SPACE = 2**64  # torch.Generator.manual_seed takes [0, 2**64)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        # One definition with the result cache's (core/generation_key.py).
        return is_greedy(self.temperature)

    def generator(self) -> torch.Generator:
        generator = torch.Generator()
        if self.seed is not None:
            # Any integer is a seed: one outside torch's range must not raise later.
            generator.manual_seed(self.seed % _SEED_SPACE)
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

    def draw(self, logits: torch.Tensor) -> int:
        """The token drawn from one row of logits [vocab]."""
        return draw_token(logits, self.params, self.generator)


def draw_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    if params.greedy:
        return _argmax(logits)
    row = logits.float()
    top = row.max()
    if not torch.isfinite(top):
        # +inf (the limit picks it), all -inf, or NaN: nothing to sample from.
        return _argmax(logits)
    # Shifted first, then divided: every value is <= 0 and the top one exactly 0, so no
    # temperature can overflow it; very negative ones underflow harmlessly to probability 0.
    probs = torch.softmax((row - top) / params.temperature, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    total = float(probs.sum())
    if not (total > 0.0 and bool(torch.isfinite(probs).all())):
        return _argmax(logits)
    return int(torch.multinomial(probs, 1, generator=generator))


def _argmax(logits: torch.Tensor) -> int:
    # NaN would win torch's argmax; it is no one's most likely token.
    return int(torch.nan_to_num(logits.float(), nan=float("-inf")).argmax())


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The smallest set of most likely tokens whose mass reaches `top_p`, renormalised.
    The most likely token always stays, whatever `top_p` rounds to in float32."""
    sorted_probs, order = torch.sort(probs, descending=True)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop = before >= top_p
    drop[0] = False
    sorted_probs[drop] = 0.0
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return kept / kept.sum()


def sample_rows(scores: torch.Tensor, rows: list[RowSampler | None]) -> dict[int, Exception]:
    """`scores` [n, vocab] with row i sampled by `rows[i]` (None or greedy: untouched).
    A sampled row comes back with its drawn token at 0 and every other one at -inf.

    A row whose sampler raises is left untouched and returned with its error, so the
    caller fails that sequence alone instead of the whole step."""
    failed: dict[int, Exception] = {}
    for i, row in enumerate(rows):
        if row is None or row.params.greedy:
            continue
        try:
            token = row.draw(scores[i])
        except Exception as exc:
            failed[i] = exc
            continue
        scores[i].fill_(float("-inf"))
        scores[i, token] = 0.0
    return failed
