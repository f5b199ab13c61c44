"""The ingress's side of generation: validate an OpenAI completion request, send it to the
model's replica as one streaming call, and answer as JSON or as server-sent events.

A request's first event is awaited before any response starts, so a refusal (queue full,
deadline, prompt too long) is a real HTTP status. After that, tokens flow as they come;
when the client goes away the replica is told to stop the sequence by a note, and the
stream is read to its end (`calls/stream_reads.py`: a cancelled call leaks in gRPC).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, Protocol

import orjson
from pydantic import ValidationError

from deployments.config import AdmissionConfig, GenerationModelConfig
from deployments.core.access.access import Charge
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.priority import Priority
from deployments.core.protocol import GenerationChunk, GenerationJob, Rejection
from deployments.errors import (
    DeadlineExceeded,
    InvalidRequest,
    ModelFailed,
    NotReady,
    TributaryError,
    rejection_error,
)
from deployments.ingress.api.dialects import Dialect
from deployments.ingress.api.generation_schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    Unsupported,
)
from deployments.ingress.api.schemas import as_invalid_request
from deployments.ingress.calls import stop_note_router
from deployments.ingress.calls.apart import apart_from_request
from deployments.ingress.calls.call_errors import RAY_CALL_ERRORS, REPLICA_GONE, ray_call_error
from deployments.ingress.calls.replica_watch import ReplicaWatch
from deployments.ingress.calls.stream_reads import SettledReads
from deployments.ingress.rollout.versions import ModelVersions, Version

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
    seen nothing, so it may run again from the start (`run_whole`)."""


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
                raise self._passed_over_error() from None
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

    def _passed_over_error(self) -> NotReady:
        return NotReady(self._passed_over_message())

    def _passed_over_message(self) -> str:
        return (
            f"Model '{self.model}': the replica generating this answer stopped answering "
            "and was passed over. Retry shortly."
        )

    def if_passed_over(self) -> None:
        """Told by the watch of a pass-over: if this call's replica was the one, its read
        ends, to be sent again before its first token (`_SendAgain`), after it with a 503
        (it would wait until Serve replaces the replica), one a whole completion may run
        again on (`PassedOverMidWay`)."""
        if self._reads is None or not self._waits_on_passed_over(not self._past_first):
            return
        if not self._past_first:
            self._reads.interrupt(_SendAgain())
        elif self._whole:
            self._reads.interrupt(PassedOverMidWay(self._passed_over_message()))
        else:
            self._reads.interrupt(self._passed_over_error())

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


class LiveGeneration:
    """A call computed by the model (not answered from the cache), with what settles it:
    the tenant's charge (refunded if it fails) and the canary guard's judgement of its
    version (a 5xx counts against it)."""

    first: GenerationChunk  # once `start` returned

    def __init__(
        self,
        call: GenerationCall,
        charge: Charge,
        table: ModelVersions,
        version: Version,
        metrics: TributaryMetrics,
    ) -> None:
        self.call = call
        self.charge = charge
        self.table = table
        self._version = version
        self._metrics = metrics
        self.started = time.monotonic()

    async def start(self, job: GenerationJob) -> None:
        with self.charged():
            self.first = await self.call.start(job)

    @contextmanager
    def charged(self) -> Iterator[None]:
        with (
            self.charge.refunded_on_failure(),
            self.table.judged(self._version, self._metrics, self.started),
        ):
            yield

    def settle(self, last: GenerationChunk | None) -> None:
        """The tenant pays the tokens the model counted; none for a stream that broke."""
        self.charge.settle(0 if last is None else last.prompt_tokens + last.completion_tokens)


def build_job(
    request: ChatCompletionRequest | CompletionRequest,
    model: GenerationModelConfig,
    request_id: str,
) -> GenerationJob:
    max_tokens, field = request.max_tokens, "max_tokens"
    if isinstance(request, ChatCompletionRequest) and request.max_completion_tokens is not None:
        max_tokens, field = request.max_completion_tokens, "max_completion_tokens"
    if max_tokens is None:
        max_tokens = min(model.default_max_tokens, model.max_tokens_limit)
    if max_tokens > model.max_tokens_limit:
        raise InvalidRequest(
            f"{field} is {max_tokens}; model '{model.name}' generates at most "
            f"{model.max_tokens_limit} tokens per request.",
            param=field,
            code="max_tokens_exceeded",
        )
    stop = request.stop_list()
    if len(stop) > model.max_stop_sequences:
        raise InvalidRequest(
            f"{len(stop)} stop sequences; at most {model.max_stop_sequences}.", param="stop"
        )
    common: dict[str, Any] = {
        "request_id": request_id,
        "max_tokens": max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "seed": request.seed,
        "stop": stop,
        "whole": not request.stream,
    }
    if isinstance(request, ChatCompletionRequest):
        messages = [{"role": m.role, "content": m.text()} for m in request.messages]
        return GenerationJob(messages=messages, **common)
    return GenerationJob(prompt=request.prompt_text(), **common)


def timeout_for(admission: AdmissionConfig, priority: Priority, asked: float | None) -> float:
    return asked if asked is not None else admission.of(priority.label).timeout_s


def parse_generation_request(
    body: bytes, dialect: Dialect
) -> ChatCompletionRequest | CompletionRequest:
    chat = is_chat(dialect)
    schema = ChatCompletionRequest if chat else CompletionRequest
    try:
        return schema.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        cause = first.get("ctx", {}).get("error")
        if isinstance(cause, Unsupported):
            raise InvalidRequest(cause.message, param=cause.param, code="unsupported") from None
        if not chat and first["loc"][:1] == ("prompt",) and _token_id_prompt(body):
            raise InvalidRequest(
                "Token-id prompts are not accepted: send the prompt as text.",
                param="prompt",
                code="token_ids_not_accepted",
            ) from None
        shapes = {
            "stop": "'stop' must be a string or an array of strings",
            "prompt": "'prompt' must be a non-empty string or a one-element array of one",
            "messages": "'messages' must be a non-empty array of {role, content} objects, "
            "role one of system, user, assistant, developer, content a string",
        }
        raise as_invalid_request(exc, shapes) from None


def _token_id_prompt(body: bytes) -> bool:
    """Whether `prompt` was sent as token ids (OpenAI allows an array of integers, or of
    arrays of them), meant to be the model's own ids. Tributary's completions take text
    only; naming the refusal tells a client that tokenized first to send the text instead."""
    try:
        prompt = orjson.loads(body).get("prompt")
    except (orjson.JSONDecodeError, AttributeError):
        return False
    items = prompt if isinstance(prompt, list) else []
    flat = [x for item in items for x in (item if isinstance(item, list) else [item])]
    return bool(flat) and all(isinstance(x, int) and not isinstance(x, bool) for x in flat)


def is_chat(dialect: Dialect) -> bool:
    return dialect.request is ChatCompletionRequest


class Reply:
    """Builds the OpenAI body of one chat or text completion, whole or as chunks."""

    def __init__(self, dialect: Dialect, model: str) -> None:
        self.chat = chat = is_chat(dialect)
        self.model = model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        # With the result cache on for this request: 1 if it was answered from the cache,
        # else 0, in `usage` as for embeddings and rerank; None: no cache, not said.
        self.cached_inputs: int | None = None

    def whole(self, text: str, last: GenerationChunk) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": last.finish_reason, "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self._usage(last),
        }

    def chunk(self, text: str, finish_reason: str | None, first: bool) -> bytes:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        if self.chat:
            choice["delta"] = {"role": "assistant", "content": text} if first else {"content": text}
        else:
            choice["text"] = text
        return self._event({**self._head(), "choices": [choice]})

    def usage_chunk(self, last: GenerationChunk) -> bytes:
        return self._event({**self._head(), "choices": [], "usage": self._usage(last)})

    def _usage(self, last: GenerationChunk) -> dict[str, int]:
        counts = usage(last)
        if self.cached_inputs is not None:
            counts["cached_inputs"] = self.cached_inputs
        return counts

    def _head(self) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    @staticmethod
    def _event(body: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(body) + b"\n\n"


def usage(chunk: GenerationChunk) -> dict[str, int]:
    return {
        "prompt_tokens": chunk.prompt_tokens,
        "completion_tokens": chunk.completion_tokens,
        "total_tokens": chunk.prompt_tokens + chunk.completion_tokens,
    }


class ChunkSource(Protocol):
    """What `sse` and `collect` read after the first chunk: a live call, or a cached
    completion replayed (ingress/cache/generation_cache.py)."""

    def rest(self) -> AsyncIterator[GenerationChunk]: ...

    def cancel(self) -> None: ...


async def run_whole(
    start: Callable[[], Awaitable[LiveGeneration]],
) -> tuple[LiveGeneration, str, GenerationChunk]:
    """A whole completion: the call `start` makes, its text and its last chunk. One whose
    replica is passed over after its first token runs again from the start, once (its
    client has seen nothing), with a charge and a deadline of its own."""
    for run in range(1, MAX_SENDS + 1):
        live = await start()
        try:
            with live.charged():
                text, last = await collect(live.call, live.first)
        except PassedOverMidWay:
            if run == MAX_SENDS:
                raise
            continue
        return live, text, last
    raise AssertionError("MAX_SENDS is at least 1")


async def collect(call: ChunkSource, first: GenerationChunk) -> tuple[str, GenerationChunk]:
    parts, last = [first.text], first
    if first.finish_reason is None:
        async for chunk in call.rest():
            parts.append(chunk.text)
            last = chunk
    call.cancel()
    return "".join(parts), last


async def sse(
    call: ChunkSource,
    first: GenerationChunk,
    reply: Reply,
    include_usage: bool,
    on_end: Callable[[GenerationChunk | None], None],
    on_complete: Callable[[str, GenerationChunk], Awaitable[None]] | None = None,
) -> AsyncIterator[bytes]:
    """The event stream; `on_end` gets the last chunk (None if the stream broke).
    `on_complete` gets the whole text and the last chunk once that chunk (the one with a
    finish reason) has been sent, before [DONE]: never for a stream that broke, nor for
    one whose client left first."""
    last: GenerationChunk | None = first
    parts = [first.text]
    try:
        yield reply.chunk(first.text, first.finish_reason, first=True)
        if first.finish_reason is None:
            async for chunk in call.rest():
                last = chunk
                parts.append(chunk.text)
                yield reply.chunk(chunk.text, chunk.finish_reason, first=False)
        if on_complete is not None and last is not None and last.finish_reason is not None:
            await on_complete("".join(parts), last)
        if include_usage and last is not None:
            yield reply.usage_chunk(last)
        yield b"data: [DONE]\n\n"
    except TributaryError as exc:
        last = None
        yield b"data: " + orjson.dumps(exc.body()) + b"\n\n"
    finally:
        call.cancel()
        on_end(last)


async def started(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`events` with its first event taken now. A generator that has started runs its
    `finally` (which ends the call) when it is dropped, through the loop's finaliser;
    one that never started does not. The response may be dropped before it reads a
    byte (its client gone as the headers went out), and must still end the call."""
    first = await anext(events)
    return _then(first, events)


async def _then(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for event in rest:
        yield event


def _no_replica(model: str) -> NotReady:
    return NotReady(f"Model '{model}' has no running replica; it is restarting. Retry shortly.")


def _call_error(model: str, priority: Priority, exc: BaseException) -> BaseException:
    if isinstance(exc, TributaryError | asyncio.CancelledError):
        return exc
    if isinstance(exc, RAY_CALL_ERRORS):
        return ray_call_error(model, priority, exc)
    logger.error("generation call to %s failed", model, exc_info=exc)
    return ModelFailed()
