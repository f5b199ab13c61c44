"""The rerank routes' request checks and response bodies, per dialect."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from deployments.config import RerankModelConfig
from deployments.core.access.access import estimate_tokens
from deployments.core.chunking import chunk_count
from deployments.core.protocol import RerankJob, RerankResult
from deployments.errors import InvalidRequest, PayloadTooLarge, too_many_passes
from deployments.ingress.api.dialects import Dialect
from deployments.ingress.api.rerank_schemas import (
    DOCUMENTS_SHAPE,
    TEXTS_SHAPE,
    RerankRequest,
    TeiRerankRequest,
)
from deployments.ingress.api.schemas import as_invalid_request


@dataclass(frozen=True)
class RerankQuery:
    """A rerank request in any dialect, as the ingress serves it."""

    dialect: Dialect  # the answer's shape follows it
    model: str | None
    query: str
    documents: list[str]
    top_n: int | None
    return_documents: bool
    max_tokens_per_doc: int | None
    raw_scores: bool
    first_chunk_only: bool
    priority: str | None


def parse_rerank_request(body: bytes, dialect: Dialect) -> RerankQuery:
    """Validate a raw JSON body in the route's dialect; one clear 400 when it is wrong."""
    try:
        if dialect.family == "tei":
            tei = TeiRerankRequest.model_validate_json(body)
        else:
            request = RerankRequest.model_validate_json(body)
    except ValidationError as exc:
        shapes = {"documents": DOCUMENTS_SHAPE, "texts": TEXTS_SHAPE}
        raise as_invalid_request(exc, shapes) from None
    if dialect.family == "tei":
        if tei.truncate and tei.truncation_direction.lower() == "left":
            raise InvalidRequest(
                "truncation_direction 'Left' is not supported for rerank: a truncated text "
                "is scored on its first window. Send 'Right', or leave truncate unset to "
                "score the whole text chunk by chunk.",
                param="truncation_direction",
            )
        query = RerankQuery(
            dialect=dialect,
            model=tei.model,
            query=tei.query,
            documents=tei.texts,
            top_n=None,
            return_documents=tei.return_text,
            max_tokens_per_doc=None,
            raw_scores=tei.raw_scores,
            first_chunk_only=bool(tei.truncate),
            priority=tei.priority,
        )
        field = "texts"
    else:
        query = RerankQuery(
            dialect=dialect,
            model=request.model,
            query=request.query,
            documents=[d if isinstance(d, str) else d.text for d in request.documents],
            top_n=request.top_n,
            return_documents=(
                request.return_documents
                if request.return_documents is not None
                else dialect.family == "cohere"  # Cohere returns them unless told not to
            ),
            max_tokens_per_doc=request.max_tokens_per_doc,
            raw_scores=request.raw_scores,
            first_chunk_only=False,
            priority=request.priority,
        )
        field = "documents"
    if not query.query.strip():
        raise InvalidRequest("'query' must not be empty.", param="query")
    if not query.documents:
        raise InvalidRequest(f"'{field}' must not be empty.", param=field)
    return query


def rerank_job(query: RerankQuery, model: RerankModelConfig, request_id: str) -> RerankJob:
    field = "texts" if query.dialect.family == "tei" else "documents"
    if len(query.documents) > model.max_documents:
        raise PayloadTooLarge(
            f"{len(query.documents)} documents in one request; model '{model.name}' "
            f"accepts at most {model.max_documents}.",
            param=field,
        )
    job = RerankJob(
        query=query.query,
        documents=query.documents,
        max_tokens_per_doc=query.max_tokens_per_doc,
        first_chunk_only=query.first_chunk_only,
        job_id=uuid.uuid4().hex,
        request_id=request_id,
        documents_param=field,
    )
    passes = estimated_chunk_passes(job, model)
    if passes > model.max_chunk_passes:
        raise too_many_passes(passes, model.name, model.max_chunk_passes, field, estimated=True)
    return dataclasses.replace(job, chunk_passes=passes)


def estimated_chunk_passes(job: RerankJob, model: RerankModelConfig) -> int:
    """The query-chunk pairs the model will score, from text lengths and the configured
    window, before any tokenizer has seen the texts. Mirrors `RerankTask._plan_job`."""
    if job.first_chunk_only:
        return len(job.documents)
    cap = model.max_tokens_per_doc
    if job.max_tokens_per_doc is not None:
        cap = min(cap, job.max_tokens_per_doc)
    room = _estimated_doc_room(model, _text_tokens(job.query))
    return sum(
        chunk_count(min(_text_tokens(doc), cap), room, model.chunk_overlap_tokens)
        for doc in job.documents
    )


# Special tokens around a pair, as BERT-style tokenizers add them: [CLS] q [SEP] d [SEP]
# for a cross-encoder, [CLS] d [SEP] for a text a bi-encoder embeds.
_PAIR_SPECIALS = 3
_TEXT_SPECIALS = 2


def _estimated_doc_room(model: RerankModelConfig, query_tokens: int) -> int:
    window = model.window_tokens
    if model.backend == "bi-encoder":
        # Query and document are embedded apart: each has the whole window.
        return max(window - _TEXT_SPECIALS, 1)
    query_tokens = min(query_tokens, (window - _PAIR_SPECIALS) // 2)
    return max(window - _PAIR_SPECIALS - query_tokens, 1)


def _text_tokens(text: str) -> int:
    # core.access.estimate_tokens's ~4 characters a token, without the special tokens.
    return len(text) // 4


def rerank_token_estimate(job: RerankJob) -> int:
    # The query is read once beside every document.
    return estimate_tokens(job.documents) + len(job.documents) * estimate_tokens([job.query])


def rerank_response(query: RerankQuery, model: str, result: RerankResult) -> Any:
    scores = result.raw if query.raw_scores else result.relevance
    # Best first; equal scores keep the documents' order.
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    if query.top_n is not None:
        order = order[: query.top_n]
    if query.dialect.family == "tei":
        ranks: list[dict[str, Any]] = []
        for i in order:
            rank: dict[str, Any] = {"index": i, "score": float(scores[i])}
            if query.return_documents:
                rank["text"] = query.documents[i]
            ranks.append(rank)
        return ranks
    results: list[dict[str, Any]] = []
    for i in order:
        entry: dict[str, Any] = {"index": i, "relevance_score": float(scores[i])}
        if query.return_documents:
            entry["document"] = {"text": query.documents[i]}
        results.append(entry)
    tokens = sum(result.token_counts)
    return {
        "id": uuid.uuid4().hex,
        "model": model,
        "results": results,
        # Jina reports usage; Cohere reports meta. Both are given.
        "usage": {"total_tokens": tokens, "truncated_documents": len(result.truncated)},
        "meta": {
            "billed_units": {"search_units": 1},
            "tokens": {"input_tokens": tokens, "output_tokens": 0},
        },
    }
