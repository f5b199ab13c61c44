"""How big a batch is, in the units `@serve.batch` compares with `max_batch_size`.

Serve's batcher knows one limit. A batch must respect two: a count of items and a budget of
padded tokens (every row is padded to the longest one, so the forward pass costs about
rows x longest). `BatchBudget.size_of` folds both into one number on the count's scale: a
batch fits exactly when it has at most `max_batch_size` items and at most
`max_batch_tokens` padded tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class Sized(Protocol):
    tokens: int


@dataclass
class BatchBudget:
    max_batch_size: int
    max_batch_tokens: int

    def size_of(self, items: Sequence[Sized]) -> int:
        if not items:
            return 0
        # An item longer than the whole budget still has to run, alone: cap its cost.
        longest = min(max(item.tokens for item in items), self.max_batch_tokens)
        padded_tokens = longest * len(items)
        token_share = math.ceil(padded_tokens * self.max_batch_size / self.max_batch_tokens)
        return max(len(items), token_share)


def budget_size(items: Sequence[BudgetedItem]) -> int:
    """`batch_size_fn` for `@serve.batch`: every item carries the budget of its replica."""
    if not items:
        return 0
    return items[0].budget.size_of(items)


class BudgetedItem(Sized, Protocol):
    budget: BatchBudget
