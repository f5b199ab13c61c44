"""Who takes the device next, among the replicas waiting for it.

The most urgent pass goes first: request class first (realtime, normal, batch), then the
model's `priority` (higher first), then the clock (the earliest time a batch's deadline or
latency target falls due), then the model with the smaller recent share of the device, then
whoever has waited longest. Ageing by share: a waiting
model whose recent share of the device is below its `min_share` goes before all of that,
so a model of low priority or a low class slows down under load but never starves.

The clock counts only within `URGENT_WITHIN_S`: a deadline minutes away says nothing about
which pass should run now, and ranking by it would let any batch with a default deadline
pass, for ever, one without (an LLM step) or one whose requests came earlier and so fall due
earlier (the long-lived sequences of an LLM against a stream of short reranks).

Between equals the share decides, not the order of arrival: taking turns pass by pass gives
each model the device in proportion to how long its passes are, and a flood of rerank passes
held it 73 % of the time against an LLM's shorter steps (docs/benchmarks.md). By share,
equals get equal time, as the cores would give them without turns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Waiter:
    slot: int
    model_key: int
    klass: int  # Priority value: 0 realtime, 1 normal, 2 batch
    priority: int  # the model's; higher goes first
    urgent_at: float  # monotonic seconds; inf where the batch has no deadline or target
    since: float  # when it began to wait
    min_share: float
    weight: int  # capacity units its pass holds


URGENT_WITHIN_S = 1.0


def urgency(urgent_at: float, now: float) -> float:
    """The time a pass falls due, where that is soon enough to order by; else inf."""
    return urgent_at if urgent_at - now <= URGENT_WITHIN_S else math.inf


def owed(waiter: Waiter, shares: Mapping[int, float]) -> bool:
    """Below its model's guaranteed share of the device's recent busy time."""
    return waiter.min_share > 0 and shares.get(waiter.model_key, 0.0) < waiter.min_share


def rank(waiter: Waiter, shares: Mapping[int, float]) -> tuple[bool, int, int, float, float, float]:
    """Smaller goes first."""
    return (
        not owed(waiter, shares),
        waiter.klass,
        -waiter.priority,
        waiter.urgent_at,
        shares.get(waiter.model_key, 0.0),
        waiter.since,
    )


def next_waiter(waiters: Sequence[Waiter], shares: Mapping[int, float]) -> Waiter | None:
    """The waiter whose turn it is, or None when nobody waits."""
    if not waiters:
        return None
    return min(waiters, key=lambda waiter: rank(waiter, shares))
