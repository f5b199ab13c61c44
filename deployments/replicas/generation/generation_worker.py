"""One generation request inside a replica, whatever the engine: tokenise, check the
limits, wait for a slot (priority, deadline), run the sequence, stream text deltas, stop
on a stop sequence, and cancel the sequence the moment its caller goes away: when the
ingress's stop note names it (`stop`; the stream then ends as a finished one does), or when
Serve cancels the call.

No Ray here: the engine is anything with `submit` and `cancel` (`Engine`), so unit tests
drive this with a fake engine and the deployment plugs in the real ones.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import Any, Protocol

from deployments.backends.generation.continuous import EngineDown, EngineOutput, OnOutput
from deployments.backends.generation.sampling import SamplingParams
from deployments.backends.generation.text_stream import TextStream
from deployments.core.batching.sequence_slots import QueueFull, SequenceSlots, Slot, SlotTimeout
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.priority import Priority
from deployments.core.protocol import (
    FinishReason,
    GenerationChunk,
    GenerationJob,
    Rejection,
)
from deployments.errors import NotReady

# What a client is told to wait when the engine is down: the replica restarts its engine
# in well under a second (0.3-0.4 s measured on the demo model, served); Serve replacing
# a whole replica takes 25-35 s.
ENGINE_RETRY_AFTER_S = 2


class Engine(Protocol):
    def submit(
        self,
        request_id: str,
        prompt: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        on_output: OnOutput,
    ) -> None: ...

    def cancel(self, request_id: str) -> None: ...

    @property
    def alive(self) -> bool: ...


class Tokenizer(Protocol):
    context_window: int

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]: ...

    def prompt_ids(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


Event = GenerationChunk | Rejection


class _Stopped:
    """What a stop note puts among a sequence's engine outputs: end the stream here."""


STOPPED = _Stopped()


class _StopNote:
    """One run's ear for the ingress's stop note: it may land while the run waits for a
    slot (`heard`) or while its sequence streams (a `STOPPED` among the outputs)."""

    def __init__(self) -> None:
        self.heard = asyncio.Event()
        self.outputs: asyncio.Queue[EngineOutput | _Stopped] | None = None

    def stop(self) -> None:
        self.heard.set()
        if self.outputs is not None:
            self.outputs.put_nowait(STOPPED)


class GenerationWorker:
    def __init__(
        self,
        lm: Tokenizer,
        engine: Engine,
        slots: SequenceSlots,
        clock: Callable[[], float] = time.monotonic,
        model: str = "",
        metrics: TributaryMetrics | None = None,
    ) -> None:
        self.lm = lm
        self.engine = engine
        self.slots = slots
        self._clock = clock
        self._model = model
        self.metrics = metrics or TributaryMetrics()
        # Sequences in the engine per class: the most urgent names the engine's step.
        self._running = dict.fromkeys(Priority, 0)
        # Called when the last sequence leaves the engine: no step follows.
        self.on_idle: Callable[[], None] | None = None
        # Runs that a stop note can end, by the key their caller chose.
        self._notes: dict[str, _StopNote] = {}
        self.counts = {
            "requests": 0,
            "completed": 0,
            "client_gone": 0,
            "stopped_by_note": 0,
            "timed_out": 0,
            "failed": 0,
            "engine_down": 0,
        }

    def stop(self, stop_key: str) -> bool:
        """The caller of the run started with `stop_key` has gone: its run ends at once, as
        a finished one does, and its sequence is cancelled. False if no such run is here
        (over already, or another replica's)."""
        note = self._notes.get(stop_key)
        if note is None:
            return False
        note.stop()
        return True

    async def run(
        self,
        priority: Priority,
        job: GenerationJob,
        time_left_s: float | None,
        stop_key: str | None = None,
    ) -> AsyncGenerator[Event, None]:
        """The job's events. With a `stop_key`, `stop(stop_key)` ends the run early."""
        if stop_key is None or stop_key in self._notes:
            note = _StopNote()  # heard by no one: a key in use is not this run's
        else:
            note = self._notes[stop_key] = _StopNote()
        try:
            async with aclosing(self._run(priority, job, time_left_s, note)) as events:
                async for event in events:
                    yield event
        finally:
            if stop_key is not None and self._notes.get(stop_key) is note:
                del self._notes[stop_key]
            if note.heard.is_set():
                self.counts["stopped_by_note"] += 1

    async def _run(
        self, priority: Priority, job: GenerationJob, time_left_s: float | None, note: _StopNote
    ) -> AsyncGenerator[Event, None]:
        arrived = self._clock()
        deadline = None if time_left_s is None else arrived + time_left_s
        self.counts["requests"] += 1
        prompt = self._prompt_ids(job)
        window = self.lm.context_window
        param = "messages" if job.messages is not None else "prompt"
        if not prompt:
            # A sequence of no tokens has nothing to condition on, and a forward pass over
            # it fails in the engine: it must never get there.
            yield Rejection(
                400,
                f"The {param} is empty once tokenized; give at least one token of text.",
                param=param,
                code="empty_prompt",
            )
            return
        if len(prompt) + job.max_tokens > window:
            yield Rejection(
                400,
                f"This model's context window is {window} tokens; the prompt has "
                f"{len(prompt)} and max_tokens asks for {job.max_tokens} more. Shorten the "
                "prompt or lower max_tokens.",
                param=param,
                code="context_length_exceeded",
            )
            return
        if not self.engine.alive:
            self.counts["engine_down"] += 1
            yield _engine_down()
            return
        try:
            self._report_sequences()
            tokens = len(prompt) + job.max_tokens
            slot = await self._slot_unless_stopped(priority, tokens, deadline, note)
        except QueueFull as full:
            yield Rejection(
                503 if priority is Priority.REALTIME else 429,
                f"The generation queue for {priority.label}-class requests is full "
                f"({full.queued} waiting, limit {full.limit}); retry shortly.",
                code="queue_full",
                retry_after_s=1,
            )
            return
        except SlotTimeout:
            self.counts["timed_out"] += 1
            yield _deadline_passed(time_left_s)
            return
        finally:
            self._report_sequences()
        if slot is None:
            return  # stopped by its caller while it waited
        self._running[priority] += 1
        try:
            # aclosing: when our caller closes us, the inner stream must run its cleanup
            # (cancel the sequence) now, not whenever it is garbage-collected.
            stream = self._stream(job, prompt, deadline, time_left_s, priority, arrived, note)
            async with aclosing(stream) as events:
                async for event in events:
                    yield event
        finally:
            self._running[priority] -= 1
            if self.on_idle is not None and not self.running:
                self.on_idle()
            self.slots.release(slot)
            self._report_sequences()

    async def _slot_unless_stopped(
        self, priority: Priority, tokens: int, deadline: float | None, note: _StopNote
    ) -> Slot | None:
        """A slot, or None once the stop note is heard first."""
        if note.heard.is_set():
            return None
        free = self.slots.try_acquire(priority, tokens)
        if free is not None:
            return free
        acquiring = asyncio.ensure_future(self.slots.acquire(priority, tokens, deadline))
        heard = asyncio.ensure_future(note.heard.wait())
        try:
            await asyncio.wait({acquiring, heard}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            heard.cancel()
            if not acquiring.done():
                acquiring.cancel()  # `acquire` passes on a slot granted meanwhile
        if acquiring.cancelled() or not acquiring.done():
            return None
        slot = acquiring.result()  # raises QueueFull or SlotTimeout as the slots said
        if note.heard.is_set():
            self.slots.release(slot)
            return None
        return slot

    @property
    def running(self) -> int:
        """Sequences in the engine now."""
        return sum(self._running.values())

    def step_class(self) -> Priority:
        """The class an engine step runs at: its most urgent sequence's (read on the
        engine's thread; a stale count costs one step at the neighbouring class)."""
        for priority, running in self._running.items():
            if running > 0:
                return priority
        return Priority.BATCH

    def _report_sequences(self) -> None:
        stats = self.slots.stats
        self.metrics.sequences(self._model, stats.running, sum(stats.waiting.values()))

    def _prompt_ids(self, job: GenerationJob) -> list[int]:
        if job.messages is not None:
            return self.lm.chat_ids(job.messages)
        return self.lm.prompt_ids(job.prompt or "")

    async def _stream(
        self,
        job: GenerationJob,
        prompt: list[int],
        deadline: float | None,
        time_left_s: float | None,
        priority: Priority,
        arrived: float,
        note: _StopNote,
    ) -> AsyncGenerator[Event, None]:
        outputs: asyncio.Queue[EngineOutput | _Stopped] = asyncio.Queue()
        note.outputs = outputs
        sequence_id = f"{job.request_id}-{uuid.uuid4().hex[:8]}"
        sampling = SamplingParams(job.temperature, job.top_p, job.seed)
        text = TextStream(self.lm.decode, job.stop)
        finished = False
        sent_any = False
        held = ""  # a whole answer's text after its first chunk, sent at the end
        output: EngineOutput | None = None
        tokens_seen, last_token_at = 0, arrived
        try:
            self.engine.submit(sequence_id, prompt, job.max_tokens, sampling, outputs.put_nowait)
        except EngineDown:
            self.counts["engine_down"] += 1
            yield _engine_down()
            return
        try:
            while not finished:
                timeout = None
                if not sent_any and deadline is not None:
                    timeout = max(0.0, deadline - self._clock())
                try:
                    item = await asyncio.wait_for(outputs.get(), timeout)
                except TimeoutError:
                    self.counts["timed_out"] += 1
                    yield _deadline_passed(time_left_s)
                    return
                while not outputs.empty() and item is not STOPPED:
                    item = outputs.get_nowait()  # each output holds every token so far
                if isinstance(item, _Stopped):
                    return  # its caller left: the finally cancels the sequence
                output = item
                if output.error is not None:
                    finished = True  # the engine has let go of it already
                    failure = self._failure(output, sent_any)
                    if isinstance(failure, Rejection):
                        yield failure
                        return
                    raise failure
                tokens_seen, last_token_at = self._time_tokens(
                    priority, len(output.tokens), tokens_seen, last_token_at
                )
                delta = text.update(output.tokens, final=output.finished)
                finished = output.finished or delta.stopped
                reason: FinishReason | None = None
                if finished:
                    reason = "stop" if delta.stopped or output.hit_eos else "length"
                if job.whole and sent_any and not finished:
                    held += delta.text
                elif delta.text or finished or not sent_any:
                    sent_any = True
                    chunk_text, held = held + delta.text, ""
                    yield GenerationChunk(chunk_text, len(prompt), len(output.tokens), reason)
            self.counts["completed"] += 1
        finally:
            if output is not None:
                self.metrics.output_tokens(self._model, priority.label, len(output.tokens))
            if not finished:
                # The caller left (its generator was closed or cancelled), or it timed
                # out: free the sequence now, not after max_tokens more steps.
                self.engine.cancel(sequence_id)
                self.counts["client_gone"] += sent_any
            elif output is not None and not output.finished:
                self.engine.cancel(sequence_id)  # a stop sequence ended it early

    def _failure(self, output: EngineOutput, sent_any: bool) -> Rejection | Exception:
        """What the caller gets for a sequence the engine failed: a rejection while no
        chunk has gone out, an exception mid-stream (the ingress ends the stream with an
        error event). A dead engine is a 503 to retry; a failure of this sequence alone
        is the model's error, and only this request sees it."""
        if output.engine_down:
            self.counts["engine_down"] += 1
            if not sent_any:
                return _engine_down()
            return NotReady(
                f"Model '{self._model}' restarted its engine mid-stream; retry the request.",
                code="engine_restarting",
                retry_after_s=ENGINE_RETRY_AFTER_S,
            )
        self.counts["failed"] += 1
        if not sent_any:
            return Rejection(500, "The model failed on this request.", code="model_error")
        return RuntimeError(f"generation failed: {output.error}")

    def _time_tokens(
        self, priority: Priority, tokens: int, seen: int, last_at: float
    ) -> tuple[int, float]:
        """Time to first token (from arrival, slot wait included) and the mean gap per
        token since the last output; returns the new (tokens seen, when)."""
        if tokens <= seen:
            return seen, last_at
        now = self._clock()
        if seen == 0:
            self.metrics.first_token(self._model, priority.label, now - last_at)
        else:
            self.metrics.inter_token(self._model, (now - last_at) / (tokens - seen))
        return tokens, now

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "slots": vars(self.slots.stats)}


def _engine_down() -> Rejection:
    return Rejection(
        503,
        "The generation engine is restarting; retry shortly.",
        code="engine_restarting",
        retry_after_s=ENGINE_RETRY_AFTER_S,
    )


def _deadline_passed(time_left_s: float | None) -> Rejection:
    limit = "" if time_left_s is None else f" of {time_left_s:g} s"
    return Rejection(
        504,
        f"No first token within the request's deadline{limit} (X-Request-Timeout or the "
        "class default).",
        code="deadline_exceeded",
    )
