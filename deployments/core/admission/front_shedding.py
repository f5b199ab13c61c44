"""How much of a class's traffic HAProxy should refuse before it reaches Python.

At twice capacity with single texts, refusing costs the ingress about as much CPU as the
model's share of two cores: refusals then queue behind refusals in front of admission and
wait seconds themselves. HAProxy refuses in microseconds, but it cannot predict waits.
So the ingress, which can, tells it a share to refuse.

Per key (the route family and the `X-Priority` header as sent: what HAProxy can see), the
ingress counts what reaches it and what its admission refuses, and publishes the share
`p` HAProxy should refuse at random so that the ingress keeps seeing `headroom` times what
it admits: it still refuses some, so the predicted wait stays the judge of who gets in,
and when load falls the admitted count falls with it and `p` follows it to zero. HAProxy
tells the ingress the share it applied to each request, so the offered load, counted
before HAProxy's refusals, is known even when several ingress replicas publish at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# What HAProxy refuses at most: some requests always reach admission, whose answers carry
# the fresh share; a share of one would never hear of the load falling.
CEILING = 0.95
# A window closes after this long and this many arrivals (or four times as long).
WINDOW_S = 1.0
MIN_ARRIVALS = 10
# A key quiet this long starts again from nothing: HAProxy has forgotten its share by then
# (bin/haproxy_front_door.py, SHARE_FRESH_S), and whoever comes back finds an idle model.
STALE_S = 3.0
# A rising share = this much of the window's estimate + the rest of the old one; a falling
# share takes the estimate at once. Refusing too much is the worse mistake: clients that
# honour Retry-After back off at once, and a share that lagged their leaving would leave
# the model idle while it refused them.
GAIN = 0.5


@dataclass
class _Window:
    started: float
    arrivals: int = 0
    offered: float = 0.0  # arrivals weighted by 1 / (1 - share applied): before HAProxy
    refused: int = 0


@dataclass
class _Key:
    """One key's current window, the share it publishes and when it was last seen."""

    window: _Window
    last_seen: float
    share: float = 0.0
    retry_after_s: int = 1
    # What admission took a second in the last window in which it also refused some: the
    # most it is known to take, while the model's speed holds.
    admitted_per_s: float | None = None


@dataclass(frozen=True)
class Advice:
    permille: int  # the share of this key's requests HAProxy refuses, in thousandths
    retry_after_s: int  # what those refusals tell clients


class FrontShedding:
    def __init__(self, headroom: float = 1.1, clock: Callable[[], float] = time.monotonic) -> None:
        if headroom <= 1:
            raise ValueError("headroom must be over 1: admission has to see some excess")
        self._headroom = headroom
        self._clock = clock
        self._keys: dict[str, _Key] = {}

    def observe(self, key: str, applied_permille: int, refused_retry_after_s: int | None) -> Advice:
        """One request of `key` reached the ingress, HAProxy having refused this key at
        `applied_permille`; `refused_retry_after_s` is the Retry-After admission refused
        it with, None when it was admitted. Returns what to tell HAProxy now."""
        now = self._clock()
        state = self._keys.get(key)
        if state is None or now - state.last_seen > STALE_S:
            # New, or quiet long enough to start again from nothing (its Retry-After kept).
            retry = 1 if state is None else state.retry_after_s
            state = self._keys[key] = _Key(_Window(now), now, retry_after_s=retry)
        state.last_seen = now
        window = state.window
        applied = min(max(applied_permille, 0), round(CEILING * 1000)) / 1000
        window.arrivals += 1
        window.offered += 1 / (1 - applied)
        if refused_retry_after_s is not None:
            window.refused += 1
            state.retry_after_s = max(1, refused_retry_after_s)
        age = now - window.started
        if age >= 4 * WINDOW_S or (age >= WINDOW_S and window.arrivals >= MIN_ARRIVALS):
            self._close(state, age)
            state.window = _Window(now)
        return self.advice(key)

    def advice(self, key: str) -> Advice:
        state = self._keys.get(key)
        if state is None:
            return Advice(0, 1)
        return Advice(round(state.share * 1000), state.retry_after_s)

    def shares(self) -> dict[str, float]:
        """Every key's current share, for /v1/stats: 0 for a key quiet past STALE_S, as
        HAProxy no longer applies its share."""
        now = self._clock()
        return {
            key: 0.0 if now - state.last_seen > STALE_S else state.share
            for key, state in self._keys.items()
        }

    def _close(self, state: _Key, seconds: float) -> None:
        window = state.window
        admitted = window.arrivals - window.refused
        if window.refused:
            state.admitted_per_s = admitted / seconds
        elif state.admitted_per_s is not None:
            # Admission took all it saw: what it could take is unknown, only that it is at
            # least what it took here, and the last window that refused some says how much
            # more. Under a steady flood the share stays; when the load falls below that,
            # it falls to nothing at once. Halving it instead, as first built, let 7x the
            # requests through to the ingress every ~10 s at twice capacity (a share of
            # 0.93 halved), and the ingress, swamped by refusals, held the model back.
            admitted = max(admitted, round(state.admitted_per_s * seconds))
        wanted = self._headroom * admitted  # what admission should see of `offered`
        estimate = min(CEILING, max(0.0, 1 - wanted / window.offered))
        old = state.share
        if window.refused == 0:
            # Never a rise on a window that refused nothing; and with nothing known of what
            # admission takes, probing back up by the headroom alone would take seconds: halve.
            estimate = min(estimate, old if state.admitted_per_s is not None else old / 2)
        state.share = estimate if estimate < old else GAIN * estimate + (1 - GAIN) * old
