"""A reranker from an embedding model: the cosine of the query's and a document's vectors.

Weaker than a cross-encoder (query and document never see each other), but it needs only
the embedding model the app already ships, so the default app ranks meaningfully with no
download. A batch embeds each distinct query once, however many of its pairs share it.
"""

from __future__ import annotations

import numpy as np

from deployments.backends.encoders.pair_scorer import Pair
from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.core.relevance import ScoreKind


class BiEncoderScorer:
    score_kind: ScoreKind = "cosine"

    def __init__(self, embedder: SentenceEmbedder) -> None:
        self.embedder = embedder
        self.window = embedder.window
        self.max_tokens = self.window.max_tokens

    @property
    def max_query_tokens(self) -> int:
        return self.window.max_body

    def doc_room(self, query_tokens: int) -> int:
        # Query and document are embedded apart: each has the whole window.
        return self.window.max_body

    def pair_tokens(self, query_tokens: int, doc_tokens: int) -> int:
        specials = len(self.window.prefix) + len(self.window.suffix)
        return max(query_tokens, doc_tokens) + specials

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return self.embedder.tokenize(texts)

    def score(self, pairs: list[Pair]) -> np.ndarray:
        queries: dict[tuple[int, ...], int] = {}
        for query, _ in pairs:
            queries.setdefault(tuple(query), len(queries))
        inputs = [self.window.wrap(list(q))[0] for q in queries]
        inputs += [self.window.wrap(doc)[0] for _, doc in pairs]
        vectors = self.embedder.embed(inputs)
        query_vectors, doc_vectors = vectors[: len(queries)], vectors[len(queries) :]
        rows = [queries[tuple(query)] for query, _ in pairs]
        return np.einsum("ij,ij->i", query_vectors[rows], doc_vectors).astype(np.float32)
