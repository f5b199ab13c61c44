"""Which waiting batches of other classes may ride along in a pass that is about to start.

Under load each class forms its own batches, and admission keeps a class's queue short
enough for its latency target: a normal pass then carries a few inputs and a batch-class
pass a few more, and the model pays a pass's fixed cost for each. Measured under twice the
capacity, a core answered half what it answers with full passes (docs/reliability.md, "Where
the cores go under the 2x load"). A pass that starts with room left in its own class's budget
takes whole batches that wait at the gate for their own turn, while they fit: the pass stays
within the budget its class's tuner chose for its target, and the riders are answered a pass
earlier than their own turn would have come.

A rider must also make the pass no dearer than the two passes it replaces. Every row of a
pass is padded to its longest, so one long rider in a pass of short texts multiplies the
pass's cost: a normal pass of 32 short texts that took one 256-token batch-class text along
computed 33 x 256 tokens instead of 32 x 16, and the normal class, whose latency admission
learns, was refused for seconds while the batch class gained one pass. With the replica's
fitted cost (`cost_model.py`) a rider is taken when the shared pass is predicted to cost at
most its own pass and the rider's apart: the fixed cost the rider saves pays for the padding
it adds. Before there is a fit, or while the fit has no cost per token (its passes were all
of one length, so it cannot price padding), only the padded tokens count, and a rider may
add none.
"""

from __future__ import annotations

from collections.abc import Sequence

from deployments.core.batching.batch_budget import BatchBudget, Sized
from deployments.core.batching.cost_model import CostFit


def riders_that_fit(
    own: Sequence[Sized],
    waiting: Sequence[Sequence[Sized]],
    budget: BatchBudget,
    cost: CostFit | None = None,
) -> list[int]:
    """The indices of the `waiting` batches, taken in their order, that fit beside `own`
    and those taken before them within `budget` and cost no more together than apart
    (`cost`: the replica's fitted pass cost, None before it has one); a batch that does
    not fit is passed over for a later one."""
    taken: list[int] = []
    rows = len(own)
    longest = max((item.tokens for item in own), default=0)
    for index, batch in enumerate(waiting):
        if not batch:
            continue
        its_longest = max(item.tokens for item in batch)
        with_it = max(longest, its_longest)
        together = (rows + len(batch), with_it)
        apart = [(rows, longest), (len(batch), its_longest)]
        if _fits(*together, budget) and _no_dearer(together, apart, cost):
            taken.append(index)
            rows, longest = together
    return taken


def _fits(rows: int, longest: int, budget: BatchBudget) -> bool:
    return rows <= budget.max_batch_size and rows * longest <= budget.max_batch_tokens


def _no_dearer(
    together: tuple[int, int], apart: Sequence[tuple[int, int]], cost: CostFit | None
) -> bool:
    """Whether one pass of `together` (rows, longest) costs at most the passes `apart`."""
    pricing = cost if cost is not None and cost.per_token_s > 0 else None

    def seconds(rows: int, longest: int) -> float:
        padded = rows * longest
        return float(padded) if pricing is None else pricing.predict_s(rows, padded)

    return seconds(*together) <= sum(seconds(*shape) for shape in apart)
