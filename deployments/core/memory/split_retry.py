"""A forward pass that runs out of memory is split in halves and retried, down to single
inputs: every input that fits is answered, and one that does not fit even alone fails on its
own, as `TooLargeForMemory`, instead of failing the batch it happened to be in.

The forward function and the fault test are given, so this is pure: a replica passes the
model's batch forward and `replicas.memory.is_memory_fault`; tests pass fakes that fail above a
token count. Any other error propagates unchanged, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

TOO_LARGE_MESSAGE = (
    "This input does not fit in the model's memory even alone; shorten it (or send it to a "
    "replica with more memory)."
)


class TooLargeForMemory(Exception):
    """The result of an input that ran out of memory in a batch of one."""


@dataclass
class SplitReport:
    """What one call of `run_split` went through."""

    faults: int = 0  # forward passes that ran out of memory
    splits: int = 0  # of those, the ones split in halves and retried
    failed_alone: int = 0  # inputs that ran out of memory alone
    largest_fault_rows: int = 0


def run_split(
    items: Sequence[T],
    forward: Callable[[list[T]], Sequence[Any]],
    is_fault: Callable[[BaseException], bool],
    after_fault: Callable[[], None] | None = None,
) -> tuple[list[Any], SplitReport]:
    """One result per item, in order: `forward`'s, or a `TooLargeForMemory` for an item
    that faulted alone. `after_fault` runs after each fault (free cached memory there)."""
    report = SplitReport()

    def attempt(part: list[T]) -> list[Any]:
        try:
            results = list(forward(part))
        except Exception as error:
            if not is_fault(error):
                raise
            faulted = True
        else:
            faulted = False
        # Retried only here, outside the except block: inside it the traceback, and with
        # it the failed pass's tensors, would stay alive through every retry.
        if faulted:
            report.faults += 1
            report.largest_fault_rows = max(report.largest_fault_rows, len(part))
            if after_fault is not None:
                after_fault()
            if len(part) == 1:
                report.failed_alone += 1
                return [TooLargeForMemory(TOO_LARGE_MESSAGE)]
            report.splits += 1
            half = len(part) // 2
            return attempt(part[:half]) + attempt(part[half:])
        if len(results) != len(part):
            raise RuntimeError(f"forward returned {len(results)} results for {len(part)} inputs")
        return results

    return attempt(list(items)), report
