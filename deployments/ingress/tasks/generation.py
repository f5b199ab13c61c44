"""The ingress's side of generation: validate an OpenAI completion request, send it to the
model's replica as one streaming call (`calls/generation_call.py`), and answer as JSON or
as server-sent events.

A request's first event is awaited before any response starts, so a refusal (queue full,
deadline, prompt too long) is a real HTTP status. After that, tokens flow as they come.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

import orjson
from pydantic import ValidationError

from deployments.config import AdmissionConfig, GenerationModelConfig
from deployments.core.access.access import Charge
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.priority import Priority
from deployments.core.protocol import GenerationChunk, GenerationJob
from deployments.errors import (
    InvalidRequest,
    TributaryError,
)
from deployments.ingress.api.dialects import Dialect
from deployments.ingress.api.generation_schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    Unsupported,
)
from deployments.ingress.api.schemas import as_invalid_request
from deployments.ingress.calls.generation_call import GenerationCall, PassedOverMidWay
from deployments.ingress.rollout.versions import ModelVersions, Version

# Runs of a whole completion: the first, and one more if its replica is passed over as
# hung after its first token (calls/silent_replicas.py).
WHOLE_RUNS = 2


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
    for run in range(1, WHOLE_RUNS + 1):
        live = await start()
        try:
            with live.charged():
                text, last = await collect(live.call, live.first)
        except PassedOverMidWay:
            if run == WHOLE_RUNS:
                raise
            continue
        return live, text, last
    raise AssertionError("WHOLE_RUNS is at least 1")


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
