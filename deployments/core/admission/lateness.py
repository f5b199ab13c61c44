"""How late the admitted and still unanswered requests already are, per class.

The wait predictor learns from answers, and an answer comes back only after the wait it
measures: when a flood starts, or the CPU is taken for a moment, every request admitted in
the first second is predicted by the calm fit, and the fit hears otherwise a second or more
later. At twice capacity here the first half-second admitted 186 normal-class requests that
waited 1.3-1.8 s against a 500 ms target, and the answers that corrected the fit came back
only then.

A request still waiting past the time it was predicted to be answered is evidence at once:
those behind it in its queue (its class and the classes below, which the replica's gate
serves after it) cannot be answered before it, so they are at least as late. Admission adds
the oldest open request's lateness to every new prediction for its class and those below.
Requests open longer than `window_s` no longer count: one held by a hung replica must not
close a class until its deadline passes; they are the deadline's to end.
"""

from __future__ import annotations

from collections.abc import Mapping

from deployments.core.priority import ALL_PRIORITIES, Priority


class OpenLateness:
    def __init__(self, window_s: Mapping[Priority, float]) -> None:
        self._window_s = dict(window_s)
        # Per class, open requests by token in the order admitted: (admitted, due), the
        # times on the caller's clock. The first is the oldest, and so, as predictions grow
        # with the queue ahead, about the earliest due.
        self._open: dict[Priority, dict[int, tuple[float, float]]] = {p: {} for p in ALL_PRIORITIES}
        self._next = 0

    def admitted(self, priority: Priority, now: float, predicted_s: float) -> int:
        """A request was admitted at `now`, predicted to be answered `predicted_s` later.
        Returns the token `closed` takes."""
        self._next += 1
        self._open[priority][self._next] = (now, now + predicted_s)
        return self._next

    def closed(self, priority: Priority, token: int) -> None:
        self._open[priority].pop(token, None)

    def late_s(self, priority: Priority, now: float) -> float:
        """Seconds past its predicted answer of the oldest open request of `priority` or a
        class above it, 0 when none is late."""
        late = 0.0
        for p in ALL_PRIORITIES:
            if p > priority:
                continue
            opened = self._open[p]
            horizon = now - self._window_s.get(p, 0.0)
            while opened:
                token, (admitted, due) = next(iter(opened.items()))
                if admitted >= horizon:
                    late = max(late, now - due)
                    break
                del opened[token]  # past the window: the deadline's to end
        return late

    def open_count(self) -> int:
        return sum(len(opened) for opened in self._open.values())
