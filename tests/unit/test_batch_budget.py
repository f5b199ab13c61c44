from dataclasses import dataclass

from deployments.core.batching.batch_budget import BatchBudget, budget_size


@dataclass
class Item:
    tokens: int
    budget: BatchBudget


def items(budget: BatchBudget, *lengths: int) -> list[Item]:
    return [Item(n, budget) for n in lengths]


def test_short_items_are_limited_by_count() -> None:
    budget = BatchBudget(max_batch_size=32, max_batch_tokens=8192)
    assert budget.size_of(items(budget, *[10] * 32)) == 32
    assert budget.size_of(items(budget, *[10] * 33)) == 33  # over the limit of 32


def test_long_items_are_limited_by_padded_tokens() -> None:
    budget = BatchBudget(max_batch_size=32, max_batch_tokens=1024)
    # 8 rows padded to 128 tokens use the whole token budget: a full batch.
    assert budget.size_of(items(budget, 5, 5, 5, 5, 5, 5, 5, 128)) == 32
    assert budget.size_of(items(budget, *[128] * 9)) > 32


def test_one_item_always_fits_even_when_longer_than_the_budget() -> None:
    budget = BatchBudget(max_batch_size=8, max_batch_tokens=100)
    assert budget.size_of(items(budget, 5000)) == 8


def test_batch_size_fn_reads_the_budget_carried_by_the_items() -> None:
    budget = BatchBudget(max_batch_size=4, max_batch_tokens=40)
    assert budget_size(items(budget, 20, 20)) == 4
    assert budget_size([]) == 0
    budget.max_batch_tokens = 80  # reconfigure takes effect for the next batch
    assert budget_size(items(budget, 20, 20)) == 2
