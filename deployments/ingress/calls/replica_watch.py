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
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger("ray.serve")

PROBE_TIMEOUT_S = 1.0
PROBE_EVERY_S = 0.5
# A first token this late starts a probe: far over the demo model's (tens of ms) and a real
# model's usual wait, well under a deadline (10 s in the reliability suite). A live replica
# answers the probe in milliseconds, so a slow one costs a question, never a refusal.
STALL_PROBE_S = 2.0


class ReplicaWatch:
    def __init__(
        self,
        model: str,
        probe: Callable[[], Awaitable[Any]],
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        probe_every_s: float = PROBE_EVERY_S,
        stall_probe_s: float = STALL_PROBE_S,
    ) -> None:
        self.model = model
        self._probe = probe
        self._probe_timeout_s = probe_timeout_s
        self._probe_every_s = probe_every_s
        self.stall_probe_s = stall_probe_s
        self._answered_at = -math.inf  # when a replica last answered the question
        self._down = asyncio.Event()
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
        """A call has waited `stall_probe_s` for its first token: find out whether a
        replica answers at all (once, as for a death), unless one answered less than
        `stall_probe_s` ago: under a queue of slow first tokens, one question a period."""
        if time.monotonic() - self._answered_at >= self.stall_probe_s:
            self._probe_once()

    def _probe_once(self) -> None:
        if self._probing is None or self._probing.done():
            self._probing = asyncio.get_running_loop().create_task(self._watch())

    async def until_down(self) -> None:
        await self._down.wait()

    async def _watch(self) -> None:
        while not await self._answers():
            if not self.down:
                logger.warning("generation model %s has no replica that answers", self.model)
                self._down.set()
            await asyncio.sleep(self._probe_every_s)
        if self.down:
            logger.info("generation model %s answers again", self.model)
            self._down = asyncio.Event()  # the outage's waiters were all woken by the old one

    async def _answers(self) -> bool:
        try:
            await asyncio.wait_for(self._probe(), self._probe_timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception:  # a timeout, or another dead replica Serve still routes to
            return False
        self._answered_at = time.monotonic()
        return True
