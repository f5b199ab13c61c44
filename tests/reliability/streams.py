"""A long streamed completion, read event by event, and the checks that it came through
whole: every event JSON, one finish_reason, usage, and `data: [DONE]` last."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx
import orjson

from bench.sse_client import DONE, SseSplitter

STREAM_TOKENS = 200


@dataclass
class StreamOutcome:
    status: int = 0
    content_events: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    completion_tokens: int | None = None
    done: bool = False
    after_done: int = 0  # events after [DONE]: there must be none
    error: str | None = None
    seconds: float = 0.0

    def problem(self) -> str | None:
        if self.error is not None:
            return self.error
        if self.status != 200:
            return f"status {self.status}"
        if not self.done or self.after_done:
            return "the stream did not end with data: [DONE]"
        if len(self.finish_reasons) != 1 or self.finish_reasons[0] not in ("stop", "length"):
            return f"finish_reason(s) {self.finish_reasons}"
        if self.completion_tokens is None:
            return "no usage chunk"
        if self.finish_reasons[0] == "length" and self.completion_tokens != STREAM_TOKENS:
            return f"cut at {self.completion_tokens} of {STREAM_TOKENS} tokens"
        return None


async def long_stream(client: httpx.AsyncClient, url: str, model: str) -> StreamOutcome:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "max_tokens": STREAM_TOKENS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    outcome = StreamOutcome()
    started = time.monotonic()
    splitter = SseSplitter()
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            outcome.status = response.status_code
            async for data in response.aiter_bytes():
                for payload in splitter.feed(data):
                    _take(outcome, payload)
    except (httpx.HTTPError, ValueError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"[:300]
    outcome.seconds = time.monotonic() - started
    return outcome


def _take(outcome: StreamOutcome, payload: bytes) -> None:
    if outcome.done:
        outcome.after_done += 1
        return
    if payload == DONE:
        outcome.done = True
        return
    event = orjson.loads(payload)
    if "error" in event:
        outcome.error = f"error event: {payload[:300]!r}"
        return
    if event.get("usage"):
        outcome.completion_tokens = int(event["usage"]["completion_tokens"])
    for choice in event.get("choices") or []:
        if choice.get("finish_reason"):
            outcome.finish_reasons.append(choice["finish_reason"])
        elif choice.get("delta", {}).get("content"):
            outcome.content_events += 1
