"""GenerationWorker with a fake engine: limits, deadlines, stop sequences, cancellation,
and the generation metrics it records."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from deployments.backends.generation.continuous import EngineDown, EngineOutput, OnOutput
from deployments.backends.generation.sampling import SamplingParams
from deployments.core.batching.sequence_slots import SequenceSlots, SlotLimits
from deployments.core.metrics.metrics import (
    INTER_TOKEN_LATENCY,
    OUTPUT_TOKENS,
    RUNNING_SEQUENCES,
    TIME_TO_FIRST_TOKEN,
    WAITING_SEQUENCES,
    MemoryRecorder,
    TributaryMetrics,
)
from deployments.core.priority import Priority
from deployments.core.protocol import GenerationChunk, GenerationJob, Rejection
from deployments.errors import NotReady
from deployments.replicas.generation.generation_worker import GenerationWorker


class FakeLM:
    context_window = 50

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return [1] * sum(len(m["content"].split()) for m in messages)

    def prompt_ids(self, text: str) -> list[int]:
        return [1] * len(text.split())

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(f"w{i} " for i in ids)


class FakeEngine:
    """Emits one token per `step()`; `hold` keeps it silent."""

    def __init__(self) -> None:
        self.live: dict[str, tuple[int, OnOutput, list[int]]] = {}
        self.cancelled: list[str] = []
        self.submitted: list[Sequence[int]] = []
        self.alive = True

    def submit(
        self, request_id: str, prompt: Sequence[int], max_new: int, s: SamplingParams, cb: OnOutput
    ) -> None:
        if not self.alive:
            raise EngineDown("down")
        self.submitted.append(prompt)
        self.live[request_id] = (max_new, cb, [])

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)
        self.live.pop(request_id, None)

    def step(self) -> None:
        for rid, (limit, cb, tokens) in list(self.live.items()):
            tokens.append(len(tokens))
            done = len(tokens) >= limit
            cb(EngineOutput(list(tokens), done))
            if done:
                del self.live[rid]


def worker(engine: FakeEngine, seqs: int = 4) -> GenerationWorker:
    limits = SlotLimits(seqs, 1000, dict.fromkeys(Priority, 8))
    return GenerationWorker(FakeLM(), engine, SequenceSlots(limits))


async def drive(engine: FakeEngine, stream, steps: int = 50) -> list:
    events = []

    async def pump() -> None:
        for _ in range(steps):
            await asyncio.sleep(0.001)
            engine.step()

    pumping = asyncio.create_task(pump())
    async for event in stream:
        events.append(event)
    pumping.cancel()
    return events


async def test_tokens_stream_and_the_last_chunk_says_length() -> None:
    engine = FakeEngine()
    job = GenerationJob("r1", max_tokens=3, prompt="a b")
    events = await drive(engine, worker(engine).run(Priority.NORMAL, job, None))
    assert all(isinstance(e, GenerationChunk) for e in events)
    assert "".join(e.text for e in events) == "w0 w1 w2 "
    assert events[-1].finish_reason == "length" and events[-1].completion_tokens == 3
    assert events[-1].prompt_tokens == 2


async def test_a_whole_answer_comes_as_its_first_chunk_and_the_rest_at_the_end() -> None:
    engine = FakeEngine()
    streamed = await drive(
        engine, worker(engine).run(Priority.NORMAL, GenerationJob("r1", 6, prompt="a"), None)
    )
    whole_job = GenerationJob("r2", 6, prompt="a", whole=True)
    whole = await drive(engine, worker(engine).run(Priority.NORMAL, whole_job, None))
    assert len(streamed) == 6 and len(whole) == 2
    assert "".join(e.text for e in whole) == "".join(e.text for e in streamed)
    assert whole[0].text == "w0 " and whole[-1].finish_reason == "length"
    assert whole[-1].completion_tokens == 6


async def test_prompt_over_the_window_is_a_400_naming_it() -> None:
    engine = FakeEngine()
    job = GenerationJob("r1", max_tokens=10, prompt="x " * 45)
    events = [e async for e in worker(engine).run(Priority.NORMAL, job, None)]
    assert len(events) == 1 and isinstance(events[0], Rejection)
    assert events[0].status == 400 and "50 tokens" in events[0].message


async def test_stop_sequence_ends_with_stop_and_cancels_the_sequence() -> None:
    engine = FakeEngine()
    job = GenerationJob("r1", max_tokens=10, prompt="a", stop=["w2"])
    events = await drive(engine, worker(engine).run(Priority.NORMAL, job, None))
    assert "".join(e.text for e in events) == "w0 w1 "
    assert events[-1].finish_reason == "stop"
    assert len(engine.cancelled) == 1 and not engine.live


async def test_no_first_token_before_the_deadline_is_a_504_and_cancels() -> None:
    engine = FakeEngine()  # never stepped: no token ever comes
    job = GenerationJob("r1", max_tokens=5, prompt="a")
    events = [e async for e in worker(engine).run(Priority.NORMAL, job, 0.05)]
    assert isinstance(events[0], Rejection) and events[0].status == 504
    assert engine.cancelled and not engine.live


async def test_closing_the_stream_cancels_the_sequence_and_frees_the_slot() -> None:
    engine = FakeEngine()
    w = worker(engine)
    stream = w.run(Priority.NORMAL, GenerationJob("r1", max_tokens=40, prompt="a"), None)
    first = await drive(engine, _first_only(stream))
    assert isinstance(first[0], GenerationChunk) and engine.live
    await stream.aclose()  # what Serve does when the caller goes away
    assert engine.cancelled and not engine.live
    assert w.slots.stats.running == 0


async def _first_only(stream):
    async for event in stream:
        yield event
        return


class StepClock:
    """A clock that moves only when told: token timings come out exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_token_timings_sequences_and_output_tokens_are_recorded() -> None:
    engine, clock, recorder = FakeEngine(), StepClock(), MemoryRecorder()
    limits = SlotLimits(4, 1000, dict.fromkeys(Priority, 8))
    generation = GenerationWorker(
        FakeLM(),
        engine,
        SequenceSlots(limits, clock=clock),
        clock=clock,
        model="tiny",
        metrics=TributaryMetrics(recorder),
    )
    job = GenerationJob("r1", max_tokens=3, prompt="a b")
    stream = generation.run(Priority.REALTIME, job, None)
    first = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    assert recorder.values(RUNNING_SEQUENCES, model="tiny") == [0, 1]
    clock.now += 0.25  # the first token comes 250 ms after arrival
    engine.step()
    await first
    for gap in (0.05, 0.03):  # then one token 50 ms later, one 30 ms after that
        clock.now += gap
        engine.step()
        await anext(stream)
    await stream.aclose()
    assert recorder.values(TIME_TO_FIRST_TOKEN, model="tiny", priority="realtime") == [0.25]
    gaps = recorder.values(INTER_TOKEN_LATENCY, model="tiny")
    assert [round(g, 6) for g in gaps] == [0.05, 0.03]
    assert recorder.values(OUTPUT_TOKENS, model="tiny", priority="realtime") == [3]
    assert recorder.values(RUNNING_SEQUENCES, model="tiny")[-1] == 0
    assert recorder.values(WAITING_SEQUENCES, model="tiny")[-1] == 0


class PoisonEngine(FakeEngine):
    """Fails the sequence of any request whose id starts with "bad" at its `fail_at`-th
    token, as the continuous engine does when one row's sampler raises."""

    def __init__(self, fail_at: int = 1) -> None:
        super().__init__()
        self.fail_at = fail_at

    def step(self) -> None:
        for rid, (_, cb, tokens) in list(self.live.items()):
            if rid.startswith("bad") and len(tokens) + 1 >= self.fail_at:
                del self.live[rid]
                cb(EngineOutput(list(tokens), True, error="sampling failed: ValueError"))
        super().step()

    def die(self) -> None:
        """The engine's thread ends: every live sequence fails as the engine's fault."""
        self.alive = False
        for _, cb, tokens in list(self.live.values()):
            cb(EngineOutput(list(tokens), True, error="stopped", engine_down=True))
        self.live.clear()


async def test_a_sequence_the_engine_fails_fails_that_request_alone() -> None:
    engine = PoisonEngine()
    w = worker(engine)
    good = asyncio.ensure_future(_all(w.run(Priority.NORMAL, GenerationJob("ok", 5, "a"), None)))
    bad = asyncio.ensure_future(_all(w.run(Priority.NORMAL, GenerationJob("bad", 5, "a"), None)))
    await asyncio.sleep(0)
    for _ in range(10):
        engine.step()
        await asyncio.sleep(0)
    good_events, bad_events = await good, await bad
    (rejection,) = bad_events
    assert isinstance(rejection, Rejection)
    assert rejection.status == 500 and rejection.code == "model_error"
    assert "".join(e.text for e in good_events) == "w0 w1 w2 w3 w4 "
    assert good_events[-1].finish_reason == "length"
    assert w.counts["failed"] == 1 and w.counts["completed"] == 1
    assert w.slots.stats.running == 0


async def test_a_sequence_failed_mid_stream_raises_for_that_stream_only() -> None:
    engine = PoisonEngine(fail_at=3)
    w = worker(engine)
    bad = w.run(Priority.NORMAL, GenerationJob("bad", 5, "a"), None)
    got: list = []
    try:
        await drive(engine, _collect(bad, got))
        raise AssertionError("the failed stream ended normally")
    except RuntimeError as exc:
        assert "sampling failed" in str(exc)
    assert [e.text for e in got] == ["w0 ", "w1 "]
    assert w.slots.stats.running == 0 and not engine.cancelled  # nothing left to cancel


async def _collect(stream, into: list):
    async for event in stream:
        into.append(event)
        yield event


async def _all(stream) -> list:
    return [event async for event in stream]


async def test_an_empty_prompt_is_a_400_and_never_reaches_the_engine() -> None:
    engine = FakeEngine()
    for job in (GenerationJob("r1", 5, ""), GenerationJob("r2", 5, "   ")):
        (event,) = await _all(worker(engine).run(Priority.NORMAL, job, None))
        assert isinstance(event, Rejection)
        assert (event.status, event.param, event.code) == (400, "prompt", "empty_prompt")
    assert engine.submitted == []


async def test_engine_death_answers_every_request_503_at_once() -> None:
    engine = PoisonEngine()
    w = worker(engine, seqs=2)
    runs = [
        asyncio.ensure_future(_all(w.run(Priority.NORMAL, GenerationJob(f"r{i}", 40, "a"), 30)))
        for i in range(4)  # two run, two wait for a slot
    ]
    await asyncio.sleep(0)
    engine.step()
    await asyncio.sleep(0.01)
    engine.die()
    done, _ = await asyncio.wait(runs, timeout=1)  # at once, not after the 30 s deadline
    assert len(done) == 4
    # The two in flight had their first chunk out: their streams end with a 503 error
    # that says to retry. The two queued were never started: a 503 rejection.
    for run in runs[:2]:
        error = run.exception()
        assert isinstance(error, NotReady) and error.status == 503
        assert error.code == "engine_restarting" and error.retry_after_s
    outcomes = [r.result()[-1] for r in runs[2:]]
    assert all(isinstance(o, Rejection) for o in outcomes)
    for rejection in outcomes:
        assert rejection.status == 503 and rejection.code == "engine_restarting"
        assert rejection.retry_after_s and rejection.retry_after_s > 0
    later = await _all(w.run(Priority.NORMAL, GenerationJob("late", 5, "a"), 30))
    assert isinstance(later[0], Rejection) and later[0].status == 503
    assert w.slots.stats.running == 0


async def test_engine_death_before_the_first_token_is_a_503() -> None:
    engine = PoisonEngine()
    w = worker(engine)
    run = asyncio.ensure_future(_all(w.run(Priority.NORMAL, GenerationJob("r", 5, "a"), 30)))
    await asyncio.sleep(0.01)
    engine.die()
    (event,) = await asyncio.wait_for(run, 1)
    assert isinstance(event, Rejection) and event.status == 503
    assert event.code == "engine_restarting" and event.retry_after_s


async def test_a_stop_note_ends_the_stream_as_a_finished_one_and_cancels_the_sequence() -> None:
    engine = FakeEngine()
    w = worker(engine)
    stream = w.run(Priority.NORMAL, GenerationJob("r1", 20, prompt="a"), None, "key-1")
    first = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)
    engine.step()
    assert isinstance(await first, GenerationChunk)
    engine.step()  # a token on its way when the note lands
    assert w.stop("key-1")
    rest = [event async for event in stream]  # ends without an error: no cancel from Serve
    assert all(isinstance(event, GenerationChunk) for event in rest)
    assert engine.cancelled and not engine.live and w.slots.stats.running == 0
    assert w.counts["stopped_by_note"] == 1 and w.counts["client_gone"] == 1
    assert not w.stop("key-1")  # over: the key names nothing any more


async def test_a_stop_note_for_a_run_waiting_for_a_slot_ends_it_with_no_event() -> None:
    engine = FakeEngine()
    w = worker(engine, seqs=1)
    holder = w.run(Priority.NORMAL, GenerationJob("r1", 20, prompt="a"), None, "key-1")
    held = asyncio.ensure_future(anext(holder))
    waiter = w.run(Priority.NORMAL, GenerationJob("r2", 20, prompt="a"), None, "key-2")
    waiting = asyncio.ensure_future(anext(waiter))
    for _ in range(5):
        await asyncio.sleep(0)
    assert sum(w.slots.stats.waiting.values()) == 1
    assert w.stop("key-2")
    with pytest.raises(StopAsyncIteration):
        await waiting
    assert sum(w.slots.stats.waiting.values()) == 0 and len(engine.submitted) == 1
    engine.step()
    assert isinstance(await held, GenerationChunk)  # the other run goes on
    await holder.aclose()


async def test_a_stop_note_names_only_the_run_that_chose_its_key() -> None:
    engine = FakeEngine()
    w = worker(engine)
    assert not w.stop("never-used")
    first = w.run(Priority.NORMAL, GenerationJob("r1", 3, prompt="a"), None, "same")
    second = w.run(Priority.NORMAL, GenerationJob("r2", 3, prompt="a"), None, "same")
    started = [asyncio.ensure_future(anext(first)), asyncio.ensure_future(anext(second))]
    await asyncio.sleep(0)
    engine.step()
    await asyncio.gather(*started)
    assert w.stop("same")  # the first run's key; the second could not take it
    assert [e async for e in first] == []
    assert len(await drive(engine, second)) == 2  # its two tokens left, to the end
