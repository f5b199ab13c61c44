"""SettledReads: a stream whose reader left is ended by a note and read to its end; one
that must be cancelled is cancelled only between reads, never during one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from deployments.ingress.calls import stream_reads
from deployments.ingress.calls.stream_reads import SettledReads


class FakeStream:
    """A Serve streaming response: `__anext__` waits for the test to hand it an item."""

    def __init__(self) -> None:
        self.items: asyncio.Queue[object] = asyncio.Queue()
        self.reads_started = 0
        self.reads_interrupted = 0
        self.reads_in_flight = 0
        self.cancelled_with_reads_in_flight: list[int] = []

    async def __anext__(self) -> object:
        self.reads_started += 1
        self.reads_in_flight += 1
        try:
            item = await self.items.get()
        except asyncio.CancelledError:
            self.reads_interrupted += 1
            raise
        finally:
            self.reads_in_flight -= 1
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled_with_reads_in_flight.append(self.reads_in_flight)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_items_come_in_order_and_the_end_is_stop_async_iteration() -> None:
    stream = FakeStream()
    reads = SettledReads(stream)
    for item in ("a", "b", StopAsyncIteration()):
        stream.items.put_nowait(item)
    assert [await reads.next(), await reads.next()] == ["a", "b"]
    with pytest.raises(StopAsyncIteration):
        await reads.next()


async def test_a_cancel_between_reads_cancels_the_call_at_once() -> None:
    stream = FakeStream()
    reads = SettledReads(stream)
    stream.items.put_nowait("a")
    await reads.next()
    reads.cancel()
    assert stream.cancelled_with_reads_in_flight == [0]


async def test_a_reader_that_leaves_mid_read_cancels_the_call_once_the_read_lands() -> None:
    stream = FakeStream()
    reads = SettledReads(stream)
    reader = asyncio.ensure_future(reads.next())
    await settle()
    reader.cancel()  # the client left while the next token was on its way
    await settle()
    reads.cancel()
    reads.cancel()  # the route's finally and the stream's own both cancel
    assert stream.cancelled_with_reads_in_flight == []
    stream.items.put_nowait("late token")
    await settle()
    assert stream.cancelled_with_reads_in_flight == [0]
    assert stream.reads_interrupted == 0


async def test_a_read_that_never_lands_is_interrupted_after_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stream_reads, "CANCEL_WAIT_S", 0.01)
    stream = FakeStream()
    reads = SettledReads(stream)
    reader = asyncio.ensure_future(reads.next())
    await settle()
    reader.cancel()
    reads.cancel()
    await asyncio.sleep(0.05)
    assert stream.reads_interrupted == 1
    assert stream.cancelled_with_reads_in_flight == [0]


async def test_a_read_left_by_one_caller_is_the_next_callers_item() -> None:
    stream = FakeStream()
    reads = SettledReads(stream)
    first = asyncio.ensure_future(reads.next())
    await settle()
    first.cancel()  # e.g. a wait for the first token that gave up
    await settle()
    second = asyncio.ensure_future(reads.next())
    stream.items.put_nowait("token")
    assert await second == "token"
    assert stream.reads_started == 1


async def test_an_error_is_raised_to_the_reader() -> None:
    stream = FakeStream()
    reads = SettledReads(stream)
    stream.items.put_nowait(RuntimeError("replica died"))
    with pytest.raises(RuntimeError, match="replica died"):
        await reads.next()


async def test_an_error_nobody_awaits_is_not_reported_as_unretrieved() -> None:
    stream = FakeStream()
    reads = SettledReads(stream)
    reported: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: reported.append(context))
    reader = asyncio.ensure_future(reads.next())
    await settle()
    reader.cancel()
    reads.cancel()
    stream.items.put_nowait(RuntimeError("replica died"))
    await settle()
    del reader
    import gc

    gc.collect()
    await settle()
    assert stream.cancelled_with_reads_in_flight == []  # it ended in its error
    assert reported == []


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached within a second")


class Note:
    """A stop note: ends `stream` when `finds` (the replica held the run), else not."""

    def __init__(self, stream: FakeStream | None, finds: bool = True) -> None:
        self.stream = stream
        self.finds = finds
        self.sent = 0

    async def __call__(self) -> bool:
        self.sent += 1
        await asyncio.sleep(0)
        if self.finds and self.stream is not None:
            self.stream.items.put_nowait("the token on its way")
            self.stream.items.put_nowait(StopAsyncIteration())
        return self.finds


async def test_a_stopped_stream_is_read_to_its_end_and_never_cancelled() -> None:
    stream = FakeStream()
    reads = SettledReads(stream)
    stream.items.put_nowait("a")
    await reads.next()
    note = Note(stream)
    reads.stop(note)
    reads.stop(note)  # the route's finally and the stream's own both stop it
    await until(lambda: reads.ended)
    await settle()
    assert note.sent == 1
    assert stream.cancelled_with_reads_in_flight == [] and stream.reads_interrupted == 0


async def test_a_stream_known_to_end_is_read_to_its_end_without_a_note() -> None:
    stream = FakeStream()
    reads = SettledReads(stream)
    reads.stop()
    stream.items.put_nowait(StopAsyncIteration())
    await until(lambda: reads.ended)
    await settle()
    assert stream.cancelled_with_reads_in_flight == []


async def test_a_note_that_finds_no_run_cancels_the_call_between_reads() -> None:
    stream = FakeStream()
    reads = SettledReads(stream)
    note = Note(stream, finds=False)  # the note reached a replica without this run
    reads.stop(note)
    await settle()
    assert note.sent == 1 and stream.cancelled_with_reads_in_flight == []
    stream.items.put_nowait("late token")  # the read in flight lands, then the cancel
    await until(lambda: stream.cancelled_with_reads_in_flight == [0])
    assert stream.reads_interrupted == 0


async def test_a_stream_that_does_not_end_after_its_note_is_cancelled_after_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stream_reads, "STOP_WAIT_S", 0.02)
    monkeypatch.setattr(stream_reads, "CANCEL_WAIT_S", 0.01)
    stream = FakeStream()
    reads = SettledReads(stream)
    reads.stop(Note(None))  # found, but the replica never ends it (a stalled replica)
    await asyncio.sleep(0.1)
    assert stream.reads_interrupted == 1
    assert stream.cancelled_with_reads_in_flight == [0]


async def test_a_read_that_landed_before_its_callback_ran_is_not_read_again() -> None:
    stream = FakeStream()
    reads = SettledReads(stream)
    landed: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    landed.set_result("the token on its way")  # landed for a reader that left
    reads._read = landed  # what a landing read leaves until its callback has run
    stream.items.put_nowait(StopAsyncIteration())
    reads.stop()
    await until(lambda: reads.ended)  # a loop over the landed read would never yield
    assert stream.reads_started == 1 and stream.cancelled_with_reads_in_flight == []


async def test_an_interrupt_ends_the_wait_not_the_read() -> None:
    """The replica watch ends the wait of a call whose replica hangs; the read itself is
    left to land or to be cancelled between reads, as any other."""
    stream = FakeStream()
    reads = SettledReads(stream)
    waiting = asyncio.ensure_future(reads.next())
    await settle()
    reads.interrupt(TimeoutError("passed over"))
    with pytest.raises(TimeoutError, match="passed over"):
        await waiting
    assert stream.reads_in_flight == 1 and stream.reads_interrupted == 0
    stream.items.put_nowait("late")
    assert await reads.next() == "late"  # the same read, landed
    assert stream.reads_started == 1


async def test_an_interrupt_between_reads_is_raised_at_the_next_read_once() -> None:
    """A reader passing an item on when its call's replica is passed over learns of it at
    its next read, instead of waiting on that replica."""
    stream = FakeStream()
    reads = SettledReads(stream)
    stream.items.put_nowait("first")
    assert await reads.next() == "first"
    reads.interrupt(TimeoutError("passed over"))
    with pytest.raises(TimeoutError, match="passed over"):
        await reads.next()
    assert stream.reads_started == 1  # no read was started for it
    stream.items.put_nowait("second")
    assert await reads.next() == "second"


async def test_a_stopped_reader_is_not_interrupted() -> None:
    stream = FakeStream()
    reads = SettledReads(stream)
    reads.interrupt(TimeoutError("passed over"))
    reads.stop()  # read to its end in the background, past the interrupt
    stream.items.put_nowait("last")
    stream.items.put_nowait(StopAsyncIteration())
    await until(lambda: reads.ended)
    assert stream.cancelled_with_reads_in_flight == []  # ended by reading, not cancelled
