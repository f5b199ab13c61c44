"""What a reranker backend offers the deployment: tokenize, size a pair, score pairs."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from deployments.core.relevance import ScoreKind

Pair = tuple[list[int], list[int]]  # query ids, document-chunk ids; no special tokens


class PairScorer(Protocol):
    score_kind: ScoreKind
    max_tokens: int  # the model's window, special tokens included

    @property
    def max_query_tokens(self) -> int:
        """Query tokens kept (the rest is cut), leaving room for the document."""
        ...

    def doc_room(self, query_tokens: int) -> int:
        """Document tokens that fit in one pass beside a query of this length."""
        ...

    def pair_tokens(self, query_tokens: int, doc_tokens: int) -> int:
        """Padded length this pair costs in a batch (the token budget's unit)."""
        ...

    def tokenize(self, texts: list[str]) -> list[list[int]]: ...

    def score(self, pairs: list[Pair]) -> np.ndarray:
        """Raw scores, float32, one per pair."""
        ...
