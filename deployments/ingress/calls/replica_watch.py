"""Whether a generation model has a replica that answers, learned when a call to it dies.

When the only replica of a model dies, Serve keeps new calls waiting until a replacement
is up, which can take longer than a request's deadline: each waiting request would end
in a 504 at its deadline. The ingress learns of the death from the first call that fails
with it (Ray says "actor died" at once, most times), or from a call that has waited
`stall_probe_s` for its first token: once in a `make test` run no call to a killed replica
failed, every one waited out its 10 s deadline (504), and Serve's controller noticed the
death only at its health check 10 s after it. This watch then asks the model a short
question (`engine_alive`) until a replica answers. While none does, the model is down:
requests get a 503 with Retry-After at once, and those already waiting for their first
token are answered the same way. With several replicas, the question is answered by a
live one within the probe timeout, and nothing is refused.

A replica that hangs is found the same way: every call is watched from its send to its
end, and one that has read nothing for `stall_probe_s` (no first token, or no next one)
asks the question. It goes to one replica, and when it goes unanswered while another
replica runs (a standby, or another serving one), that replica is passed over
(silent_replicas.py), every watched call is told (`if_passed_over`: those on that replica
are sent again before their first token, or after it end, or run again if whole), and the
question is asked again at once, of the others. When none answers, every call is told the
model is down (`if_down`: those waiting for a first token are refused, streams stalled
mid-way end).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ray.serve.request_router import ReplicaID

from deployments.ingress.calls.silent_replicas import SILENT, SilentReplicas

logger = logging.getLogger("ray.serve")

PROBE_TIMEOUT_S = 1.0
PROBE_EVERY_S = 0.5
# A first token (or a next one) this late starts a probe: far over the demo model's (tens
# of ms) and a real model's usual wait, well under a deadline (10 s in the reliability
# suite). A live replica answers the probe in milliseconds, so a slow one costs a
# question, never a refusal.
STALL_PROBE_S = 2.0


# Calls are looked at this many times a stall period: one that stalls asks within
# 1/CHECKS_PER_STALL of the period after it.
CHECKS_PER_STALL = 4


class WatchedCall(Protocol):
    last_read_at: float  # time.monotonic() of its send, then of its last item

    def if_passed_over(self) -> None:
        """A replica was passed over: end this call's wait if it was its replica."""

    def if_down(self) -> None:
        """No replica answers: end this call's wait if it cannot end otherwise."""


class ReplicaWatch:
    def __init__(
        self,
        model: str,
        probe: Callable[[str], Awaitable[Any]],
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        probe_every_s: float = PROBE_EVERY_S,
        stall_probe_s: float = STALL_PROBE_S,
        silent: SilentReplicas = SILENT,
    ) -> None:
        """`probe(key)`: asks the model `engine_alive`; `key` names the question to the
        router, which notes the replica it sent it to in `silent`."""
        self.model = model
        self._probe = probe
        self._silent = silent
        self._probe_timeout_s = probe_timeout_s
        self._probe_every_s = probe_every_s
        self.stall_probe_s = stall_probe_s
        self._answered_at = -math.inf  # when a replica last answered the question
        self._down = False  # no replica answered the last question
        self._passed_one_over = False  # by the last question left unanswered
        # The calls out to the model, from send to end: looked at for stalls, told of a
        # pass-over or an outage. Weak: a call whose reader was dropped unfinished is not
        # kept by this.
        self.calls: weakref.WeakSet[WatchedCall] = weakref.WeakSet()
        self._checking: asyncio.Task[None] | None = None
        self._probing: asyncio.Task[None] | None = None

    @property
    def down(self) -> bool:
        return self._down

    @property
    def in_doubt(self) -> bool:
        """A call died with a replica and no replica has answered since: not known to be
        down yet, but not known to be serving either (what /healthz reports)."""
        return self._probing is not None and not self._probing.done()

    def call_died(self) -> None:
        """A call to the model failed because its replica is gone: find out whether
        another answers (once; a probe already under way covers this death too)."""
        self._probe_once()

    def call_stalled(self) -> None:
        """A call has read nothing for `stall_probe_s`: find out whether a replica
        answers at all (once, as for a death), unless one answered less than
        `stall_probe_s` ago: under a queue of slow first tokens, one question a period."""
        if time.monotonic() - self._answered_at >= self.stall_probe_s:
            self._probe_once()

    def _probe_once(self) -> None:
        if self._probing is None or self._probing.done():
            self._probing = asyncio.get_running_loop().create_task(self._watch())

    def watching(self, call: WatchedCall) -> None:
        """`call` was sent: looked at every `stall_probe_s / CHECKS_PER_STALL` until
        `done_watching`, and told of pass-overs and outages meanwhile."""
        self.calls.add(call)
        if self._checking is None or self._checking.done():
            self._checking = asyncio.get_running_loop().create_task(self._check_calls())

    def done_watching(self, call: WatchedCall) -> None:
        self.calls.discard(call)

    async def _check_calls(self) -> None:
        while self.calls:
            await asyncio.sleep(self.stall_probe_s / CHECKS_PER_STALL)
            since = time.monotonic() - self.stall_probe_s
            if any(call.last_read_at <= since for call in list(self.calls)):
                self.call_stalled()

    def passes_over(self, replica_id: ReplicaID) -> bool:
        return self._silent.passed_over(replica_id)

    async def _watch(self) -> None:
        while not await self._answers():
            if self._passed_one_over:
                for call in list(self.calls):
                    call.if_passed_over()
                continue  # ask another at once
            if not self.down:
                logger.warning("generation model %s has no replica that answers", self.model)
                self._down = True
            for call in list(self.calls):  # those sent while down were refused at send
                call.if_down()
            await asyncio.sleep(self._probe_every_s)
        if self.down:
            logger.info("generation model %s answers again", self.model)
            self._down = False

    async def _answers(self) -> bool:
        key = uuid.uuid4().hex
        self._passed_one_over = False
        try:
            await asyncio.wait_for(self._probe(key), self._probe_timeout_s)
        except asyncio.CancelledError:
            raise
        except TimeoutError:
            self._passed_one_over = self._silent.unanswered(key)
            if self._passed_one_over:
                logger.warning("a replica of generation model %s hangs; passed over", self.model)
            return False
        except Exception:  # another dead replica Serve still routes to
            self._silent.answered(key)
            return False
        self._silent.answered(key)
        self._answered_at = time.monotonic()
        return True
