"""Reading a Serve streaming call so that it ends without a cancel whenever it can.

Between deployments Serve streams over gRPC, and grpc.aio leaks when a stream is
cancelled (grpc/grpc#43360, open): the native buffers of a read cancelled in flight, ~500
bytes in the ingress, and ~1 KB in the replica whose side of the call was cancelled, for
every client that leaves a stream, without end. So when its reader goes away (the client
left, a deadline passed), the call is not cancelled: `stop` sends the replica a plain note
that ends its generator as a finished one ends, and reads the stream on to that end in
the background. Only a stream the note could not end (no such run on the replica that got
the note, or no end within `STOP_WAIT_S`) is cancelled, and then between two reads: a read
in flight is left to land first, for at most `CANCEL_WAIT_S`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

# How long a cancel waits for the read in flight to land. A running sequence answers
# within a token's time; a whole completion (one chunk at its end) or a stalled replica
# does not, and its work is stopped after this bound at the old price of one leaked read.
CANCEL_WAIT_S = 0.5
# How long a stopped stream may take to end after its note went out: the note's trip and
# the token on its way, under load. Past it the call is cancelled.
STOP_WAIT_S = 2.0

# Streams being read to their end after their reader left, and their notes; held here so
# that their tasks are not collected half-way.
_ENDING: set[asyncio.Future[Any]] = set()

# A note to the replica that the reader left; True if it found the run to end.
StopNote = Callable[[], Awaitable[bool]]


class SettledReads:
    """One streaming call's reads: `next()` returns its items (StopAsyncIteration at the
    end); `stop()` ends the call for a reader that left; `cancel()` stops the call once no
    read is in flight."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._read: asyncio.Future[Any] | None = None
        self._cancelling = False
        self._stopping = False
        self.ended = False  # the stream's end (or its error) has been read
        self._waiter: asyncio.Future[Any] | None = None  # of the caller of `next`
        self._interrupted: BaseException | None = None  # for the next caller of `next`

    async def next(self) -> Any:
        """The stream's next item. Cancelling the caller (or `interrupt`) leaves the read
        itself running: the next caller (or `cancel`) picks it up."""
        if (interrupted := self._interrupted) is not None:
            self._interrupted = None
            raise interrupted
        read = self._read
        if read is not None and read.done():
            # Landed, its callback not run yet: its item went to whoever awaited it (or
            # to no one). Awaiting it again would return at once, and a loop of such reads
            # would never yield to let the callback run.
            self._landed(read)
            read = None
        if read is None:
            if self.ended:
                raise StopAsyncIteration
            read = self._read = asyncio.ensure_future(self._stream.__anext__())
            read.add_done_callback(self._landed)
        # asyncio.shield, with an outer future of our own that `interrupt` may end first.
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        read.add_done_callback(partial(_pass_on, waiter))
        try:
            return await waiter
        finally:
            self._waiter = None

    def interrupt(self, exc: BaseException) -> None:
        """Raises `exc` in the caller waiting in `next`, or in the reader's next call if
        none waits (it may be between reads, passing an item on); the read goes on."""
        if self._waiter is None or self._waiter.done():
            self._interrupted = self._interrupted or exc
        else:
            self._waiter.set_exception(exc)

    def _landed(self, read: asyncio.Future[Any]) -> None:
        if self._read is read:
            self._read = None
        if not read.cancelled() and read.exception() is not None:
            # Whoever awaited it has it; none may have: reading it marks it seen.
            self.ended = True

    def stop(self, note: StopNote | None = None) -> None:
        """The reader has gone. `note` asks the replica to end the stream; without one the
        stream is known to end by itself (it answered a refusal). Either way it is read
        to its end in the background, and cancelled only if the note found nothing to end
        or the end does not come within `STOP_WAIT_S`. Safe to call more than once."""
        self._interrupted = None  # its reader has gone
        if self.ended or self._stopping:
            return
        self._stopping = True
        task = asyncio.get_running_loop().create_task(self._end(note))
        _ENDING.add(task)
        task.add_done_callback(_ENDING.discard)

    async def _end(self, note: StopNote | None) -> None:
        reading = asyncio.ensure_future(self._read_to_end())
        waits: set[asyncio.Future[Any]] = {reading}
        told = None if note is None else asyncio.ensure_future(note())
        if told is not None:
            waits.add(told)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + STOP_WAIT_S
        try:
            while not reading.done() and (left := give_up - loop.time()) > 0:
                done, _ = await asyncio.wait(
                    waits, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                if told is not None and told in done:
                    waits.discard(told)
                    if told.exception() is not None or not told.result():
                        break  # no run to end on the replica it reached
        finally:
            # The read in flight, if any, is shielded: `cancel` waits for it to land.
            reading.cancel()
            if told is not None and not told.done():
                _ENDING.add(told)  # a note is bounded by its sender; left to land
                told.add_done_callback(_ENDING.discard)
        if not self.ended:
            self.cancel()

    async def _read_to_end(self) -> None:
        while not self.ended:
            try:
                await self.next()
            except Exception:  # StopAsyncIteration included: `ended` is set
                return

    def cancel(self) -> None:
        """Cancels the call now if no read is in flight, else as soon as the read lands,
        or after `CANCEL_WAIT_S` at the latest. Safe to call more than once, and after the
        stream ended (Serve's cancel is then a no-op)."""
        read = self._read
        if read is None:
            if not self.ended:
                self._stream.cancel()
            return
        if self._cancelling:
            return
        self._cancelling = True
        bound = asyncio.get_running_loop().call_later(CANCEL_WAIT_S, read.cancel)

        def after(_: asyncio.Future[Any]) -> None:
            bound.cancel()
            if not self.ended:
                self._stream.cancel()

        read.add_done_callback(after)


def _pass_on(waiter: asyncio.Future[Any], read: asyncio.Future[Any]) -> None:
    if waiter.done():  # interrupted, or its caller cancelled
        return
    if read.cancelled():
        waiter.cancel()
    elif (exc := read.exception()) is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(read.result())
