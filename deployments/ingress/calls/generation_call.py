"""One request's streaming call to a generation replica, from its send to its end.

The first item is awaited under the request's deadline; a call waiting for it on a
replica the replica watch passes over as hung is sent again, once (nothing of it reached
the client). Past it, the watch may end the call's read (a stream whose replica hangs).
When its reader leaves, the replica is told to stop the sequence by a note and the stream
is read to its end (`stream_reads.py`: a cancelled call leaks in gRPC).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from deployments.core.priority import Priority
from deployments.core.protocol import GenerationChunk, GenerationJob, Rejection
from deployments.errors import (
    DeadlineExceeded,
    ModelFailed,
    NotReady,
    TributaryError,
    rejection_error,
)
from deployments.ingress.calls import stop_note_router
from deployments.ingress.calls.apart import apart_from_request
from deployments.ingress.calls.call_errors import RAY_CALL_ERRORS, REPLICA_GONE, ray_call_error
from deployments.ingress.calls.replica_watch import ReplicaWatch
from deployments.ingress.calls.stream_reads import SettledReads

logger = logging.getLogger("ray.serve")

# How long past its deadline the ingress waits for the replica to say 504 itself; short,
# because a replica that died says nothing and the client's deadline has passed already.
DEADLINE_GRACE_S = 0.5
# How long a stop note may take to reach its replica and answer; one that does not (no
# replica, or one too busy to answer) leaves the stream to be cancelled instead.
STOP_NOTE_TIMEOUT_S = 1.0
# Sends of one call: the first, and one more if its replica is passed over as hung while
# it waits for its first token (calls/silent_replicas.py).
MAX_SENDS = 2


class _SendAgain(Exception):
    """The replica watch passed a replica over while this call waited on one."""


class PassedOverMidWay(NotReady):
    """A whole completion's replica was passed over after its first token: its client has
    seen nothing, so it may run again from the start (tasks/generation.py, `run_whole`)."""


class GenerationCall:
    """One request's streaming call to a generation replica."""

    def __init__(
        self, model: str, handle: Any, priority: Priority, timeout_s: float, watch: ReplicaWatch
    ) -> None:
        self.model = model
        self._handle = handle
        self.priority = priority
        self.timeout_s = timeout_s
        self._watch = watch
        self._reads: SettledReads | None = None
        self._stop_key = ""  # of the last send
        self._past_first = False  # the first item came: the call cannot be sent again
        self._whole = False  # a whole completion: no item between its first and its last
        self._final_read = False  # the chunk with a finish reason came: the stream ends
        self.last_read_at = 0.0  # time.monotonic() of the send, then of the last item read

    async def start(self, job: GenerationJob) -> GenerationChunk:
        """Sends the job and returns its first chunk, or raises the API error it got. A
        call still waiting for its first token on a replica the replica watch passes over
        as hung is sent again (nothing of it reached the client), within the same deadline."""
        if self._watch.down:
            raise _no_replica(self.model)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        for send in range(1, MAX_SENDS + 1):
            self._send(job, max(deadline - loop.time(), 0.0))
            try:
                first = await self._first_read(deadline)
            except _SendAgain:
                self.cancel()
                if send < MAX_SENDS:
                    continue
                raise self._passed_over_error(NotReady) from None
            except TimeoutError:
                self.cancel()
                raise DeadlineExceeded(
                    f"No first token within the request's deadline of {self.timeout_s:g} s."
                ) from None
            except BaseException as exc:
                self.cancel()
                raise self._error_of(exc) from None
            break
        assert self._reads is not None
        if isinstance(first, Rejection):
            self._watch.done_watching(self)
            self._reads.stop()  # the replica's stream ends after its refusal
            raise rejection_error(first)
        self._past_first = True
        self._final_read = first.finish_reason is not None
        self.last_read_at = time.monotonic()
        return first

    def _send(self, job: GenerationJob, time_left_s: float) -> None:
        # Names this call to its replica in a stop note; the request id may be a client's.
        self._stop_key = uuid.uuid4().hex
        with apart_from_request():  # ended by our stop note, not by Serve's cancel
            stream = self._handle.options(stream=True).generate.remote(
                self.priority.label, job, time_left_s, self._stop_key
            )
        self._reads = SettledReads(stream)
        self._whole = job.whole
        self.last_read_at = time.monotonic()
        self._watch.watching(self)

    async def _first_read(self, deadline: float) -> Any:
        """The stream's first item; TimeoutError past `deadline` (and a grace for the
        replica's own 504). The watch ends the wait sooner (`if_down`, `if_passed_over`)."""
        assert self._reads is not None
        async with asyncio.timeout_at(deadline + DEADLINE_GRACE_S):
            return await self._reads.next()

    def _waits_on_passed_over(self, unplaced_counts: bool) -> bool:
        """Whether this call waits on a replica the watch passed over: one passed over by
        name, or, if `unplaced_counts`, one not known to have taken the call (Serve never
        heard it accept)."""
        runs_on = stop_note_router.RUNS.replica_of(self._stop_key)
        if runs_on is None:
            return unplaced_counts
        return self._watch.passes_over(runs_on)

    def _passed_over_error(self, kind: type[NotReady]) -> NotReady:
        return kind(
            f"Model '{self.model}': the replica generating this answer stopped answering "
            "and was passed over. Retry shortly."
        )

    def if_passed_over(self) -> None:
        """Told by the watch of a pass-over: if this call's replica was the one, its read
        ends: before its first token to be sent again (`_SendAgain`); after it, a whole
        completion's to run again (`PassedOverMidWay`), a stream's with a 503 (it would
        wait until Serve replaces the replica)."""
        if self._reads is None or not self._waits_on_passed_over(not self._past_first):
            return
        self._reads.interrupt(_SendAgain() if not self._past_first else self._mid_way_error())

    def _mid_way_error(self) -> NotReady:
        return self._passed_over_error(PassedOverMidWay if self._whole else NotReady)

    def if_down(self) -> None:
        """Told by the watch that no replica answers: a call waiting for its first token
        is refused now (Serve would hold it until a new replica is up, past its deadline),
        and a stream past it that has read nothing for a stall period ends with a 503 (it
        would wait as long). A whole completion reads nothing until its end: left alone."""
        if self._reads is None:
            return
        if not self._past_first:
            self._reads.interrupt(_no_replica(self.model))
        elif not self._whole and self._stalled():
            self._reads.interrupt(self._stalled_error())

    def _stalled(self) -> bool:
        return time.monotonic() - self.last_read_at >= self._watch.stall_probe_s

    def _stalled_error(self) -> NotReady:
        return NotReady(
            f"Model '{self.model}' has no replica that answers; the one generating this "
            "answer stopped. Retry shortly."
        )

    async def rest(self) -> AsyncIterator[GenerationChunk]:
        assert self._reads is not None
        self.last_read_at = time.monotonic()
        try:
            while True:
                try:
                    chunk = await self._reads.next()
                except StopAsyncIteration:
                    return
                self.last_read_at = time.monotonic()
                self._final_read = chunk.finish_reason is not None
                yield chunk
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise self._error_of(exc) from None
        finally:
            self.cancel()

    def _error_of(self, exc: BaseException) -> BaseException:
        if isinstance(exc, _SendAgain):  # told as its first item landed, raised past it
            return self._mid_way_error()
        if isinstance(exc, REPLICA_GONE):
            self._watch.call_died()
        return _call_error(self.model, self.priority, exc)

    def cancel(self) -> None:
        """Ends the call for a reader that is gone; a no-op once the stream is over."""
        if self._reads is None:
            return
        self._watch.done_watching(self)
        if self._waits_on_passed_over(unplaced_counts=False):
            self._reads.cancel()  # a note would wait on a replica that does not answer
        else:
            self._reads.stop(None if self._final_read else partial(self._send_stop, self._stop_key))

    async def _send_stop(self, stop_key: str) -> bool:
        try:
            stopping = self._handle.stop_sequence.remote(stop_key)
            heard = bool(await asyncio.wait_for(stopping, STOP_NOTE_TIMEOUT_S))
        except Exception as exc:  # the stream is cancelled instead
            logger.info("could not tell model %s to stop a sequence: %r", self.model, exc)
            heard = False
        STOP_NOTES.count(self.model, heard)
        return heard


class StopNoteCounts:
    """Per model, in this ingress process: the stop notes whose replica ended the run they
    named (`heard`), and the rest (`not_heard`: the run had just ended on its own, or the
    note timed out or failed), whose streams were cancelled instead."""

    def __init__(self) -> None:
        self._counts: dict[str, dict[str, int]] = {}

    def count(self, model: str, heard: bool) -> None:
        counts = self._counts.setdefault(model, {"heard": 0, "not_heard": 0})
        counts["heard" if heard else "not_heard"] += 1

    def of(self, model: str) -> dict[str, int]:
        return dict(self._counts.get(model, {"heard": 0, "not_heard": 0}))


STOP_NOTES = StopNoteCounts()


def _no_replica(model: str) -> NotReady:
    return NotReady(f"Model '{model}' has no running replica; it is restarting. Retry shortly.")


def _call_error(model: str, priority: Priority, exc: BaseException) -> BaseException:
    if isinstance(exc, TributaryError | asyncio.CancelledError):
        return exc
    if isinstance(exc, RAY_CALL_ERRORS):
        return ray_call_error(model, priority, exc)
    logger.error("generation call to %s failed", model, exc_info=exc)
    return ModelFailed()
