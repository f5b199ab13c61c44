"""What a job weighs in the predicted wait: the model's work in it, in tokens.

A forward pass takes time by the tokens it computes, not by the inputs in it: one
400-token document costs what forty 10-token queries do. Counting inputs made the measured
service rate a property of whatever lengths came last (an earlier client's long documents
made 24 short rerank requests look like half a second of work on an idle server). In
tokens the rate stays one figure across lengths, and the work ahead of a request is what the
model really has to do before it.

The estimate is made before any tokenizer has run: ~4 characters a token (as
`core.access.estimate_tokens` and the rerank planner count), capped at what the model
reads of an input, plus a fixed charge per sequence for what a pass spends on each row
whatever its length (special tokens, pooling, padding to the batch's longest row). The
predictor's fit corrects what is left of the error in scale (its slope) and in overhead
(its base), so the estimate needs to be proportional to the work, not exact.
"""

from __future__ import annotations

from collections.abc import Callable

from deployments.core.protocol import EmbedJob, RerankJob

CHARS_PER_TOKEN = 4
PER_SEQUENCE_TOKENS = 8  # a row's cost beside its tokens: specials, pooling, some padding
# What an embedding model reads of one input when its config does not say: BERT-style
# encoders stop at 512 positions (MiniLM's sentence-transformers config at 256).
DEFAULT_WINDOW_TOKENS = 512
PAIR_SPECIALS = 3  # [CLS] query [SEP] document [SEP]


def text_tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN


def embed_work(job: EmbedJob, window: int = DEFAULT_WINDOW_TOKENS) -> int:
    if job.token_ids is not None:
        lengths = [len(ids) for ids in job.token_ids]
    else:
        lengths = [text_tokens(text) for text in job.texts or ()]
    return sum(min(length, window) + PER_SEQUENCE_TOKENS for length in lengths)


def rerank_work(job: RerankJob, window: int = DEFAULT_WINDOW_TOKENS) -> int:
    """Every document's tokens the model reads, and the query again beside each chunk."""
    cap = job.max_tokens_per_doc
    documents = sum(
        text_tokens(doc) if cap is None else min(text_tokens(doc), cap) for doc in job.documents
    )
    chunks = len(job)  # the planner's chunk passes, at least one a document
    query = min(text_tokens(job.query), window // 2) + PAIR_SPECIALS
    return documents + chunks * (query + PER_SEQUENCE_TOKENS)


def work_of(window: int | None = None) -> Callable[[object], int]:
    """The weight of a batched job in tokens: embeddings and rerank by their text, any
    other job by its inputs (one token-equivalent sequence each)."""
    limit = window or DEFAULT_WINDOW_TOKENS

    def weigh(job: object) -> int:
        if isinstance(job, EmbedJob):
            return embed_work(job, limit)
        if isinstance(job, RerankJob):
            return rerank_work(job, limit)
        return len(job) * PER_SEQUENCE_TOKENS  # type: ignore[arg-type]

    return weigh
