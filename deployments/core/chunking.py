"""Split a long document into overlapping token chunks, and fold chunk scores into one.

A reranker sees a query and one document at a time through a window of a few hundred
tokens. A longer document is scored chunk by chunk; neighbouring chunks overlap so a
passage cut at a boundary still appears whole in one of them. The document's score is
then its best chunk's by default: a relevant paragraph in a long irrelevant report still
makes the report relevant.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

DocScore = Literal["max", "mean", "first"]


def chunk_spans(length: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """[start, end) token spans covering `length` tokens in chunks of at most `size`,
    consecutive chunks sharing at least `overlap` tokens (clamped below `size`). Starts
    are spread evenly, so the last chunk is full size too rather than a near copy of the
    one before it."""
    if size < 1:
        raise ValueError("chunk size must be at least 1")
    if length <= size:
        return [(0, length)]
    stride = max(size - max(overlap, 0), 1)
    gaps = math.ceil((length - size) / stride)
    return [(start, start + size) for start in _spread(length - size, gaps)]


def _spread(last_start: int, gaps: int) -> list[int]:
    return [round(i * last_start / gaps) for i in range(gaps + 1)]


def combine_scores(scores: Sequence[float], how: DocScore = "max") -> float:
    """One document's score from its chunks' scores, in chunk order."""
    if not scores:
        raise ValueError("a document has at least one chunk")
    if how == "max":
        return max(scores)
    if how == "mean":
        return sum(scores) / len(scores)
    return scores[0]


def chunk_count(length: int, size: int, overlap: int) -> int:
    """len(chunk_spans(length, size, overlap)), without building the spans."""
    if size < 1:
        raise ValueError("chunk size must be at least 1")
    if length <= size:
        return 1
    stride = max(size - max(overlap, 0), 1)
    return math.ceil((length - size) / stride) + 1
