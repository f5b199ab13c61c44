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

A replica that hangs is found the same way, by a call that waits for its first token: the
question goes to one replica, and when it goes unanswered while another replica runs (a
standby, or another serving one), that replica is passed over (silent_replicas.py), the
calls waiting for a first token are told to send again (`passed_over`), and the question
is asked again at once, of the others.
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
# A first token this late starts a probe: far over the demo model's (tens of ms) and a real
# model's usual wait, well under a deadline (10 s in the reliability suite). A live replica
# answers the probe in milliseconds, so a slow one costs a question, never a refusal.
STALL_PROBE_S = 2.0


class MidRun(Protocol):
    last_read_at: float  # time.monotonic() of its last item

    def if_passed_over(self) -> None:
        """A replica was passed over: end this call's wait if it was its replica."""


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
        self._down = asyncio.Event()
        self._passed_over = asyncio.Event()
        self._passed_one_over = False  # by the last question left unanswered
        # Told of every pass-over: the calls reading past their first token (they wait
        # with no deadline, so each is told rather than each waiting on an event). Weak:
        # a call whose reader was dropped unfinished is not kept by this.
        self.mid_run: weakref.WeakSet[MidRun] = weakref.WeakSet()
        self._checking: asyncio.Task[None] | None = None
        self._probing: asyncio.Task[None] | None = None

    @property
    def down(self) -> bool:
        return self._down.is_set()

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
        """A call has waited `stall_probe_s` for its first token, or read nothing for as
        long past it: find out whether a replica answers at all (once, as for a death),
        unless one answered less than `stall_probe_s` ago: under a queue of slow first
        tokens, one question a period."""
        if time.monotonic() - self._answered_at >= self.stall_probe_s:
            self._probe_once()

    def _probe_once(self) -> None:
        if self._probing is None or self._probing.done():
            self._probing = asyncio.get_running_loop().create_task(self._watch())

    async def until_down(self) -> None:
        await self._down.wait()

    @property
    def passed_over(self) -> asyncio.Event:
        """Set when a replica is passed over after this moment: a call that holds it and
        still waits for its first token may be waiting on that replica, and sends again."""
        return self._passed_over

    def reading(self, call: MidRun) -> None:
        """`call` reads past its first token: told of pass-overs, and looked at every
        `stall_probe_s`; one that has read nothing for that long is a stalled call (a
        replica that hangs while every call on it is mid-way is found so, with no new
        call to wait for a first token)."""
        self.mid_run.add(call)
        if self._checking is None or self._checking.done():
            self._checking = asyncio.get_running_loop().create_task(self._check_mid_run())

    def done_reading(self, call: MidRun) -> None:
        self.mid_run.discard(call)

    async def _check_mid_run(self) -> None:
        while self.mid_run:
            await asyncio.sleep(self.stall_probe_s)
            now = time.monotonic()
            if any(now - call.last_read_at >= self.stall_probe_s for call in list(self.mid_run)):
                self.call_stalled()

    def passes_over(self, replica_id: ReplicaID) -> bool:
        return self._silent.passed_over(replica_id)

    async def _watch(self) -> None:
        while not await self._answers():
            if self._passed_one_over:
                self._passed_over.set()
                self._passed_over = asyncio.Event()
                for call in list(self.mid_run):
                    call.if_passed_over()
                continue  # ask another at once
            if not self.down:
                logger.warning("generation model %s has no replica that answers", self.model)
                self._down.set()
            await asyncio.sleep(self._probe_every_s)
        if self.down:
            logger.info("generation model %s answers again", self.model)
            self._down = asyncio.Event()  # the outage's waiters were all woken by the old one

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
