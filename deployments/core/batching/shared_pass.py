"""Which waiting batches of other classes may ride along in a pass that is about to start.

Under load each class forms its own batches, and admission keeps a class's queue short
enough for its latency target: a normal pass then carries a few inputs and a batch-class
pass a few more, and the model pays a pass's fixed cost for each. Measured under twice the
capacity, a core answered half what it answers with full passes (docs/reliability.md, "Where
the cores go under the 2x load"). A pass that starts with room left in its own class's budget
takes whole batches that wait at the gate for their own turn, while they fit: the pass stays
within the budget its class's tuner chose for its target, and the riders are answered a pass
earlier than their own turn would have come.
"""

from __future__ import annotations

from collections.abc import Sequence

from deployments.core.batching.batch_budget import BatchBudget, Sized


def riders_that_fit(
    own: Sequence[Sized], waiting: Sequence[Sequence[Sized]], budget: BatchBudget
) -> list[int]:
    """The indices of the `waiting` batches, taken in their order, that fit beside `own`
    and those taken before them within `budget`; a batch that does not fit is passed over
    for a later, smaller one."""
    taken: list[int] = []
    rows = len(own)
    longest = max((item.tokens for item in own), default=0)
    for index, batch in enumerate(waiting):
        if not batch:
            continue
        with_it = max(longest, max(item.tokens for item in batch))
        if _fits(rows + len(batch), with_it, budget):
            taken.append(index)
            rows += len(batch)
            longest = with_it
    return taken


def _fits(rows: int, longest: int, budget: BatchBudget) -> bool:
    return rows <= budget.max_batch_size and rows * longest <= budget.max_batch_tokens
