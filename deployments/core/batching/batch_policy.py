"""Each class's batch size, token budget and wait, chosen from the cost model, the classes'
latency targets and how busy each class is. The configured numbers are ceilings.

Three rules:

- **No wait for a batch that will not fill.** A class that receives less than one item per
  batch window gains nothing by waiting, so its items go at once. This is what a lone client
  pays for otherwise: the whole window, every request. Only items that found company count
  (`BatchTuner.arrived`): a lone client that sends its next request the moment it has an
  answer arrives often, yet never while its last one waits.
- **A class with a latency target bounds its own batches.** Its p99 is roughly its wait plus
  the pass it may find running at the gate plus its own pass. A share (`TARGET_SHARE`) of the
  target, less the wait, is split evenly between those two passes: the *slot*. The class's
  token budget is what the cost model says fits in the slot.
- **The slot follows what the class measures.** The split above is only where the slot
  starts. Each targeted class keeps the latency its recent items saw, from their request's
  arrival at the ingress to the end of their pass (the ingress says how long each job had
  spent with it when the call left, so its queue counts too); when their 99th
  percentile passes `TARGET_SHARE` of the target the slot shrinks by a fifth (at once when
  one item misses the target); while it stays under `GROW_BELOW` of the target and passes
  are filling the slot's budget, it grows by a tenth (a quarter when far under), up to the
  share itself. So a model that is slower than its fit under load (the CPU shared with the
  ingress, say) gets shorter passes, and a comfortable target lets batches grow.
- **Only misses the slot could cure shrink it.** An item that waited at the replica no
  longer than its window and one slot was late for other reasons (the ingress's queue, a CPU
  busy with other work); its lateness does not count against the slot. Without this rule,
  under twice the capacity every class's passes shrank to a few texts for the sake of a
  realtime tail they could not mend, and the model got through half as much.
- **Only evidence about the slot as it is moves it.** An item that reached the replica
  before the slot last moved waited behind passes planned with the old slot: it is not
  counted, and the window starts afresh at each move. Otherwise one stall would shrink the
  slot once for every item caught in it, down to the floor, and growing back takes far
  longer than falling.
- **Every class respects the tightest slot.** The model runs one pass at a time and a pass
  is not interrupted, so a realtime item may have to wait for a batch-class pass that was
  already running. The batch class therefore keeps its passes within the realtime slot too:
  smaller batches, more of them, and the gate puts realtime between them.

Until the cost model has a fit (the first few passes after start), the ceilings hold.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from deployments.core.batching.cost_model import CostFit

# The part of a target that the wait and the two passes may use; the rest is left for what
# the model does not see (the hops before the replica, queueing behind other batches of the
# class, a noisy machine).
TARGET_SHARE = 0.75
# A slot is never shorter than this many times a pass's fixed overhead (the fitted
# intercept), where the overhead would be most of the pass.
SLOT_FLOOR_INTERCEPTS = 2.0
# A slot grows while its class's recent p99 stays under this share of the target.
GROW_BELOW = 0.5


@dataclass(frozen=True)
class ClassLimits:
    """One class's configured ceilings and target."""

    max_batch_size: int
    max_batch_tokens: int
    wait_s: float
    target_s: float | None
    # The budget while no higher class has sent anything for a while (`BatchTuner`).
    alone_max_batch_tokens: int | None = None
    # ...and no more than a pass the cost model predicts to end within this.
    alone_max_pass_s: float | None = None


@dataclass(frozen=True)
class BatchPlan:
    max_batch_size: int
    max_batch_tokens: int
    wait_s: float
    why: str  # one short phrase for /v1/stats
    bounded_by_slot: bool = False

    def report(self) -> dict[str, float | int | str]:
        return {
            "max_batch_size": self.max_batch_size,
            "max_batch_tokens": self.max_batch_tokens,
            "wait_ms": round(self.wait_s * 1e3, 3),
            "why": self.why,
        }


class SlotControl:
    """One targeted class's slot, moved by the latencies its items saw."""

    WINDOW = 64
    EVERY = 16

    def __init__(self, limits: ClassLimits, clock: Callable[[], float] = time.monotonic) -> None:
        assert limits.target_s is not None
        self.target_s = limits.target_s
        self.ceiling_s = max(limits.target_s * TARGET_SHARE - limits.wait_s, 0.0)
        self.slot_s = self.ceiling_s / 2
        self._wait_s = limits.wait_s
        self._clock = clock
        self._recent: list[float] = []  # every item's, for the report
        self._fresh: list[float] = []  # those that arrived since the slot last moved
        self._new = 0
        self._binding = False
        self._moved_at = -math.inf

    def observe(
        self,
        latency_s: float,
        arrived_s: float | None = None,
        replica_wait_s: float | None = None,
    ) -> None:
        """One item's latency; `arrived_s`, when it reached the replica (the clock's time),
        tells whether it saw the slot as it is now; `replica_wait_s`, how long it waited
        there for its pass."""
        self._recent.append(latency_s)
        del self._recent[: -self.WINDOW]
        if arrived_s is not None and arrived_s < self._moved_at:
            return
        if replica_wait_s is not None and replica_wait_s <= self.slot_s + self._wait_s:
            # What the slot can cure is the wait at the replica behind other passes. An
            # item that waited there no longer than planned was late elsewhere (the
            # ingress's queue, a CPU taken by other work): shorter passes would not have
            # helped it and would only cost throughput. Under 2x overload they halved it.
            latency_s = min(latency_s, self.target_s * TARGET_SHARE)
        self._fresh.append(latency_s)
        del self._fresh[: -self.WINDOW]
        if latency_s > self.target_s:
            # Already late: shrink now rather than after the next EVERY items, which at a
            # few realtime requests a second would be seconds of more misses.
            self._shrink()
            return
        self._new += 1
        if self._new < self.EVERY:
            return
        self._new = 0
        high = window_p99(self._fresh)
        if high > self.target_s * TARGET_SHARE:
            self._shrink()
        elif high < self.target_s * GROW_BELOW and self._binding:
            step = 1.25 if high < self.target_s * GROW_BELOW / 2 else 1.1
            self._move(min(self.slot_s * step, self.ceiling_s))
        self._binding = False

    def _shrink(self) -> None:
        # Not below an eighth of the ceiling: misses that shorter passes cannot cure (a
        # machine busy with other work) must not ratchet the batches down to one row.
        self._move(max(self.slot_s * 0.8, self.ceiling_s / 8))

    def _move(self, slot_s: float) -> None:
        if slot_s == self.slot_s:
            return
        self.slot_s = slot_s
        self._moved_at = self._clock()
        self._fresh.clear()
        self._new = 0

    def note_binding(self) -> None:
        """A pass filled the budget this slot set: a larger slot would have been used.
        Only then may the slot grow; a quiet replica's fast items say nothing about how
        long a pass may be."""
        self._binding = True

    def report(self) -> dict[str, float]:
        return {
            "slot_ms": round(self.slot_s * 1e3, 2),
            "recent_p99_ms": round(window_p99(self._recent) * 1e3, 2),
        }


def window_p99(latencies_s: list[float]) -> float:
    """A window's 99th percentile (nearest rank): the target's own measure. Of 64 items it
    is their worst; one stall then moves the slot once, not once per item it caught,
    because the items that saw the old slot are not counted after a move."""
    ordered = sorted(latencies_s)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)] if ordered else 0.0


def slot_s(limits: ClassLimits) -> float | None:
    """The longest one pass may run for this class to meet its target; None without one."""
    if limits.target_s is None:
        return None
    return max(limits.target_s * TARGET_SHARE - limits.wait_s, 0.0) / 2


def plan_classes(
    limits: dict[str, ClassLimits],
    arrivals_per_s: dict[str, float],
    fit: CostFit | None,
    tokens_per_row: float,
    slots_s: dict[str, float] | None = None,
) -> dict[str, BatchPlan]:
    """One plan per class, from the same snapshot of the replica. `slots_s` are the
    targeted classes' live slots; a targeted class missing there starts from `slot_s`."""
    live = slots_s or {}
    slots = [
        live.get(name, s)
        for name, s in ((name, slot_s(one)) for name, one in limits.items())
        if s is not None
    ]
    tightest = min(slots) if slots else None
    if tightest is not None and fit is not None:
        # A pass that is mostly its fixed overhead buys nothing: keep room for some rows.
        tightest = max(tightest, SLOT_FLOOR_INTERCEPTS * fit.intercept_s)
    return {
        name: _plan_one(one, arrivals_per_s.get(name, 0.0), fit, tokens_per_row, tightest)
        for name, one in limits.items()
    }


def _plan_one(
    limits: ClassLimits,
    arrivals_per_s: float,
    fit: CostFit | None,
    tokens_per_row: float,
    tightest_slot_s: float | None,
) -> BatchPlan:
    idle = arrivals_per_s * limits.wait_s < 1.0
    wait = 0.0 if idle else limits.wait_s
    reasons = ["idle: no wait"] if idle and limits.wait_s > 0 else []
    tokens = limits.max_batch_tokens
    slot_bound = False
    if fit is not None and tightest_slot_s is not None:
        fits = fit.tokens_within(tightest_slot_s, tokens_per_row)
        # At least one row of the usual length, so the class always moves.
        bounded = max(fits, int(tokens_per_row), 1)
        if bounded < tokens:
            tokens = bounded
            slot_bound = True
            reasons.append(f"{tightest_slot_s * 1e3:.0f} ms slot")
    return BatchPlan(
        max_batch_size=limits.max_batch_size,
        max_batch_tokens=tokens,
        wait_s=wait,
        why=", ".join(reasons) or "ceilings",
        bounded_by_slot=slot_bound,
    )
