"""Messages between the ingress and a reranker deployment.

One `RerankJob` is one HTTP request: a query and its documents. As for embeddings, the
ingress sends the jobs of one priority class together and gets one outcome per job back;
a job the model cannot serve gets an `Rejection` (the shared rejection shape).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from deployments.core.jobs import Rejection


@dataclass(frozen=True)
class RerankJob:
    query: str
    documents: list[str]
    # Tokens of each document that are scored (None: the model's configured cap).
    max_tokens_per_doc: int | None = None
    # Score only each document's first window, as a plain truncating reranker does.
    first_chunk_only: bool = False
    job_id: str = ""
    request_id: str = ""
    # The ingress's estimate of the query-chunk pairs the model will score.
    chunk_passes: int = 0
    # The request field holding the documents, for errors: "documents", or TEI's "texts".
    documents_param: str = "documents"

    def __len__(self) -> int:
        # Admission counts what the model will score, chunk passes: one long document is
        # many of them. Every document is at least one, whatever the estimate says.
        return max(self.chunk_passes, len(self.documents))


@dataclass(frozen=True)
class RerankResult:
    raw: np.ndarray  # per document: the model's raw score (logit or cosine) of its best chunk
    relevance: np.ndarray  # per document: the same mapped into [0, 1]
    token_counts: list[int]  # per document: tokens fed to the model over all its chunks
    chunks: list[int]  # per document: how many chunks were scored
    truncated: list[int] = field(default_factory=list)  # documents cut at max_tokens_per_doc


RerankOutcome = RerankResult | Rejection
