"""GenerationWorker with a fake engine: limits, deadlines, stop sequences, cancellation,
and the generation metrics it records."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from deployments.backends.continuous import EngineOutput, OnOutput
from deployments.backends.sampling import SamplingParams
from deployments.core.generation_jobs import GenerationChunk, GenerationJob, GenerationRejection
from deployments.core.metrics import (
    INTER_TOKEN_LATENCY,
    OUTPUT_TOKENS,
    RUNNING_SEQUENCES,
    TIME_TO_FIRST_TOKEN,
    WAITING_SEQUENCES,
    MemoryRecorder,
    TributaryMetrics,
)
from deployments.core.priority import Priority
from deployments.core.sequence_slots import SequenceSlots, SlotLimits
from deployments.generation_worker import GenerationWorker


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

    def submit(
        self, request_id: str, prompt: Sequence[int], max_new: int, s: SamplingParams, cb: OnOutput
    ) -> None:
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


async def test_prompt_over_the_window_is_a_400_naming_it() -> None:
    engine = FakeEngine()
    job = GenerationJob("r1", max_tokens=10, prompt="x " * 45)
    events = [e async for e in worker(engine).run(Priority.NORMAL, job, None)]
    assert len(events) == 1 and isinstance(events[0], GenerationRejection)
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
    assert isinstance(events[0], GenerationRejection) and events[0].status == 504
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
