"""What the ingress sends a generation replica, and what streams back. Plain data: it
crosses Ray between the two, and the ingress builds it without any model code."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class GenerationJob:
    request_id: str
    max_tokens: int
    prompt: str | None = None  # /v1/completions
    messages: list[dict[str, str]] | None = None  # /v1/chat/completions
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class GenerationChunk:
    """New text since the last chunk. The last chunk has `finish_reason` set; every chunk
    carries the counts so far, so the last one is the request's usage."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason | None = None
