"""ReplicaWatch and GenerationCall with fakes: a generation model whose only replica died
refuses at once with 503 + Retry-After, a request already waiting for its first token is
answered the same way instead of at its deadline, and a model that still has a live
replica refuses nothing. The served form: tests/reliability/test_replica_kill.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ray.exceptions import RayActorError

from deployments.core.priority import Priority
from deployments.core.protocol import GenerationChunk, GenerationJob
from deployments.errors import DeadlineExceeded, NotReady
from deployments.ingress.calls.generation_call import GenerationCall
from deployments.ingress.calls.replica_watch import ReplicaWatch

FAST = {"probe_timeout_s": 0.05, "probe_every_s": 0.02}


class Probe:
    """engine_alive as the ingress's handle answers it: at once, or never (no replica)."""

    def __init__(self, answers: bool) -> None:
        self.answers = answers
        self.calls = 0

    async def __call__(self, key: str) -> bool:
        self.calls += 1
        if not self.answers:
            await asyncio.sleep(3600)
        return True


class Stream:
    """A streaming call's response: its first item after `wait_s`, or an error."""

    def __init__(self, wait_s: float, error: BaseException | None = None) -> None:
        self.wait_s = wait_s
        self.error = error
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        await asyncio.sleep(self.wait_s)
        if self.error is not None:
            raise self.error
        return GenerationChunk(text="hi", finish_reason=None, prompt_tokens=1, completion_tokens=1)

    def cancel(self) -> None:
        self.cancelled = True


class QuietAfterFirst(Stream):
    """A stream whose first item comes at once and the next after `then_s`."""

    def __init__(self, then_s: float) -> None:
        super().__init__(wait_s=0)
        self.then_s = then_s
        self.items = 0

    async def __anext__(self) -> Any:
        self.items += 1
        if self.items > 1:
            await asyncio.sleep(self.then_s)
        return await super().__anext__()


class Handle:
    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.generate = self

    def options(self, **_: Any) -> Handle:
        return self

    def remote(self, *_: Any) -> Stream:
        return self.stream


def job(whole: bool = False) -> GenerationJob:
    return GenerationJob(request_id="r", prompt="hi", messages=None, max_tokens=4, whole=whole)


def call(stream: Stream, watch: ReplicaWatch, timeout_s: float = 5) -> GenerationCall:
    return GenerationCall("llm", Handle(stream), Priority.NORMAL, timeout_s, watch)


async def until(condition: Any, timeout_s: float = 2) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_a_death_with_no_replica_left_turns_the_model_down_until_one_answers() -> None:
    probe = Probe(answers=False)
    watch = ReplicaWatch("llm", probe, **FAST)
    watch.call_died()
    watch.call_died()  # the same outage: one probe loop
    await until(lambda: watch.down)
    probe.answers = True
    await until(lambda: not watch.down)
    assert probe.calls >= 2


async def test_a_death_with_a_live_replica_left_refuses_nothing() -> None:
    watch = ReplicaWatch("llm", Probe(answers=True), **FAST)
    watch.call_died()
    await asyncio.sleep(0.2)
    assert not watch.down


async def test_from_a_death_until_a_replica_answers_the_model_is_in_doubt() -> None:
    probe = Probe(answers=False)
    watch = ReplicaWatch("llm", probe, probe_timeout_s=0.3, probe_every_s=0.02)
    assert not watch.in_doubt
    watch.call_died()
    assert watch.in_doubt and not watch.down  # at once, before the first probe times out
    await until(lambda: watch.down)
    probe.answers = True
    await until(lambda: not watch.in_doubt)
    assert not watch.down


async def test_a_request_to_a_down_model_is_refused_at_once_with_retry_after() -> None:
    watch = ReplicaWatch("llm", Probe(answers=False), **FAST)
    watch.call_died()
    await until(lambda: watch.down)
    stream = Stream(wait_s=3600)
    started = time.monotonic()
    with pytest.raises(NotReady) as refused:
        await call(stream, watch).start(job())
    assert time.monotonic() - started < 0.1
    assert refused.value.status == 503 and refused.value.retry_after_s


async def test_a_request_waiting_for_its_first_token_is_refused_when_the_model_goes_down() -> None:
    probe = Probe(answers=False)
    watch = ReplicaWatch("llm", probe, **FAST)
    stream = Stream(wait_s=3600)  # Serve holds it: no replica to send it to
    waiting = asyncio.create_task(call(stream, watch, timeout_s=30).start(job()))
    await asyncio.sleep(0.05)
    watch.call_died()  # another request's call failed: the replica is gone
    started = time.monotonic()
    with pytest.raises(NotReady):
        await waiting
    assert time.monotonic() - started < 1
    # The read held by Serve never lands, so the call is cancelled after the bound.
    await until(lambda: stream.cancelled)


async def test_a_call_that_dies_with_its_replica_is_a_503_and_starts_the_watch() -> None:
    probe = Probe(answers=False)
    watch = ReplicaWatch("llm", probe, **FAST)
    with pytest.raises(NotReady):
        await call(Stream(wait_s=0, error=RayActorError()), watch).start(job())
    await until(lambda: watch.down)


async def test_without_an_outage_the_deadline_still_holds() -> None:
    watch = ReplicaWatch("llm", Probe(answers=True), **FAST)
    with pytest.raises(DeadlineExceeded):
        await call(Stream(wait_s=3600), watch, timeout_s=0.1).start(job())


async def test_a_first_token_is_returned_as_before() -> None:
    watch = ReplicaWatch("llm", Probe(answers=True), **FAST)
    first = await call(Stream(wait_s=0), watch).start(job())
    assert first.text == "hi"


async def test_a_first_token_that_stalls_asks_whether_a_replica_answers() -> None:
    """No call died: the replica went while nothing was out to it, and Serve holds the
    next calls. The wait for a first token starts the probe, and the request is refused at
    once when none answers, long before its deadline."""
    probe = Probe(answers=False)
    watch = ReplicaWatch("llm", probe, **FAST, stall_probe_s=0.1)
    stream = Stream(wait_s=3600)
    started = time.monotonic()
    with pytest.raises(NotReady):
        await call(stream, watch, timeout_s=30).start(job())
    assert time.monotonic() - started < 1
    assert probe.calls >= 1 and watch.down
    await until(lambda: stream.cancelled)


async def test_a_slow_first_token_from_a_live_replica_is_only_a_question() -> None:
    probe = Probe(answers=True)
    watch = ReplicaWatch("llm", probe, **FAST, stall_probe_s=0.1)
    first = await call(Stream(wait_s=0.35), watch).start(job())
    assert first.text == "hi"
    assert probe.calls <= 3 and not watch.down  # a question a period at most, no refusal


async def test_stalled_calls_ask_once_a_period_while_the_replica_answers() -> None:
    probe = Probe(answers=True)
    watch = ReplicaWatch("llm", probe, **FAST, stall_probe_s=0.2)
    watch.call_stalled()
    await until(lambda: probe.calls == 1 and not watch.in_doubt)
    for _ in range(10):  # a queue of slow first tokens: the answer just given stands
        watch.call_stalled()
    await asyncio.sleep(0.05)
    assert probe.calls == 1
    await asyncio.sleep(0.2)
    watch.call_stalled()
    await until(lambda: probe.calls == 2)


async def test_a_stream_stalled_mid_way_ends_with_a_503_when_no_replica_answers() -> None:
    """The model's only replica hangs while a stream is mid-way: the stream reads nothing
    for a stall period, the question goes unanswered, and the stream ends with a 503
    rather than waiting until Serve replaces the replica."""
    watch = ReplicaWatch("llm", Probe(answers=False), **FAST, stall_probe_s=0.1)
    streaming = call(QuietAfterFirst(then_s=3600), watch, timeout_s=30)
    await streaming.start(job())
    started = time.monotonic()
    with pytest.raises(NotReady) as ended:
        async for _ in streaming.rest():
            pass
    assert time.monotonic() - started < 1 and ended.value.retry_after_s
    assert watch.down


async def test_a_whole_completion_mid_way_is_left_to_its_end_when_no_replica_answers() -> None:
    """A whole completion sends nothing between its first chunk and its last: silence is
    not a stall, and an outage found meanwhile does not end it."""
    watch = ReplicaWatch("llm", Probe(answers=False), **FAST, stall_probe_s=0.1)
    whole = call(QuietAfterFirst(then_s=0.4), watch, timeout_s=30)
    await whole.start(job(whole=True))
    reading = asyncio.ensure_future(anext(whole.rest()))
    await until(lambda: watch.down)
    assert (await reading).text == "hi"
