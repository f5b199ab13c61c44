"""Reading a Serve streaming call so that cancelling it never interrupts a read.

Between deployments Serve streams over gRPC, and grpc.aio leaks the native buffers of a
read that is cancelled while in flight (grpc/grpc#43360, open): ~500 bytes a call in the
ingress, for every client that leaves a stream, without end. So a read is never
cancelled here. When its reader goes away (the client left, a deadline passed), a read in
flight is left to land, which for a running sequence is its next token (milliseconds),
and the call is cancelled once it has; cancelled between reads, it leaves nothing behind
in the ingress. (The replica's side of a cancelled stream leaks on its own, ~1 KB each:
docs/reliability.md.) A read that has not landed within `CANCEL_WAIT_S` is cancelled in
flight, as before: the replica must not compute for a client that left for longer than that.
"""

from __future__ import annotations

import asyncio
from typing import Any

# How long a cancel waits for the read in flight to land. A running sequence answers
# within a token's time; a whole completion (one chunk at its end) or a stalled replica
# does not, and its work is stopped after this bound at the old price of one leaked read.
CANCEL_WAIT_S = 0.5


class SettledReads:
    """One streaming call's reads: `next()` returns its items (StopAsyncIteration at the
    end); `cancel()` stops the call once no read is in flight."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._read: asyncio.Future[Any] | None = None
        self._cancelling = False

    async def next(self) -> Any:
        """The stream's next item. Cancelling the caller leaves the read itself running:
        the next caller (or `cancel`) picks it up."""
        read = self._read
        if read is None:
            read = self._read = asyncio.ensure_future(self._stream.__anext__())
            read.add_done_callback(self._landed)
        return await asyncio.shield(read)

    def _landed(self, read: asyncio.Future[Any]) -> None:
        if self._read is read:
            self._read = None
        if not read.cancelled():
            read.exception()  # whoever awaited it has it; none may have: mark it seen

    def cancel(self) -> None:
        """Cancels the call now if no read is in flight, else as soon as the read lands,
        or after `CANCEL_WAIT_S` at the latest. Safe to call more than once, and after the
        stream ended (Serve's cancel is then a no-op)."""
        read = self._read
        if read is None:
            self._stream.cancel()
            return
        if self._cancelling:
            return
        self._cancelling = True
        bound = asyncio.get_running_loop().call_later(CANCEL_WAIT_S, read.cancel)

        def after(_: asyncio.Future[Any]) -> None:
            bound.cancel()
            self._stream.cancel()

        read.add_done_callback(after)
