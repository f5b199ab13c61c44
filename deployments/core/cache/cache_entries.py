"""What one cached item holds, as bytes: everything the response needs about that item, so
a hit answers exactly as a fresh computation would (bitwise for vectors and scores).

Embedding entry: token count (u32), truncated flag (u8), then the float32 vector.
Rerank entry: raw score and relevance (f64 each: the replica's float32 raw and float64
relevance both survive exactly), token count and chunk count (u32), truncated flag (u8).
Generation entry (greedy completions only): prompt and completion token counts (u32),
finish reason (u8: 0 stop, 1 length), then the completion's text in UTF-8.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from deployments.core.protocol import FinishReason

# In every key: a change to the layouts below gets new keys, so a shared Redis never hands
# one build's entries to another that would misread them.
ENTRY_FORMAT = "entry-v1"

_EMBED_HEAD = struct.Struct("<IB")
_RERANK = struct.Struct("<ddIIB")
_GENERATION_HEAD = struct.Struct("<IIB")
_FINISH_REASONS: tuple[FinishReason, ...] = ("stop", "length")


@dataclass(frozen=True)
class EmbedEntry:
    vector: np.ndarray  # (dim,) float32
    tokens: int
    truncated: bool


@dataclass(frozen=True)
class RerankEntry:
    raw: float
    relevance: float
    tokens: int
    chunks: int
    truncated: bool


@dataclass(frozen=True)
class GenerationEntry:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason


def pack_embed(entry: EmbedEntry) -> bytes:
    vector = np.ascontiguousarray(entry.vector, dtype=np.float32)
    return _EMBED_HEAD.pack(entry.tokens, entry.truncated) + vector.tobytes()


def unpack_embed(value: bytes) -> EmbedEntry:
    tokens, truncated = _EMBED_HEAD.unpack_from(value)
    vector = np.frombuffer(value, dtype=np.float32, offset=_EMBED_HEAD.size)
    return EmbedEntry(vector, tokens, bool(truncated))


def pack_rerank(entry: RerankEntry) -> bytes:
    return _RERANK.pack(entry.raw, entry.relevance, entry.tokens, entry.chunks, entry.truncated)


def unpack_rerank(value: bytes) -> RerankEntry:
    raw, relevance, tokens, chunks, truncated = _RERANK.unpack(value)
    return RerankEntry(raw, relevance, tokens, chunks, bool(truncated))


def pack_generation(entry: GenerationEntry) -> bytes:
    head = _GENERATION_HEAD.pack(
        entry.prompt_tokens, entry.completion_tokens, _FINISH_REASONS.index(entry.finish_reason)
    )
    # surrogatepass: whatever str the model's decoder gave back comes back the same.
    return head + entry.text.encode("utf-8", "surrogatepass")


def unpack_generation(value: bytes) -> GenerationEntry:
    prompt, completion, reason = _GENERATION_HEAD.unpack_from(value)
    text = value[_GENERATION_HEAD.size :].decode("utf-8", "surrogatepass")
    return GenerationEntry(text, prompt, completion, _FINISH_REASONS[reason])
