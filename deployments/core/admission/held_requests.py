"""How many requests one ingress replica holds at once, all models together.

Every request the ingress holds is a connection HAProxy counts against the replica's
`maxconn`; once that is full, new requests wait in HAProxy's queue, unseen by admission,
realtime behind nothing it can judge. So the ingress keeps its own count below HAProxy's
bound and refuses at once past a share of it per class: batch may fill half, normal most,
realtime all of it, so a flood of a lower class always leaves room for the higher ones.
Per-model admission (queues, predicted wait) decides first; this only caps the sum.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from deployments.core.admission.admission import Refusal, refusal_status
from deployments.core.priority import Priority

DEFAULT_SHARES: dict[Priority, float] = {
    Priority.REALTIME: 1.0,
    Priority.NORMAL: 0.85,
    Priority.BATCH: 0.5,
}


class HeldRequests:
    def __init__(self, limit: int, shares: Mapping[Priority, float] = DEFAULT_SHARES) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self._bounds = {p: max(1, int(limit * share)) for p, share in shares.items()}
        self.held = 0
        self.refused = dict.fromkeys(Priority, 0)

    def check(self, priority: Priority) -> Refusal | None:
        bound = self._bounds.get(priority, self.limit)
        if self.held < bound:
            return None
        self.refused[priority] += 1
        # The held requests are answered or refused within their targets: a second is
        # about when a place frees up.
        return Refusal("held", refusal_status(priority), 1, self.held, bound)

    @contextmanager
    def holding(self) -> Iterator[None]:
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1

    def report(self) -> dict[str, object]:
        return {
            "held": self.held,
            "limit": self.limit,
            "bounds": {p.label: b for p, b in self._bounds.items()},
            "refused": {p.label: n for p, n in self.refused.items() if n},
        }
