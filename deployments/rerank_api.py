"""The rerank routes' request checks and response bodies, per dialect."""

from __future__ import annotations

import uuid
from typing import Any

from deployments.config import RerankModelConfig
from deployments.core.access import estimate_tokens
from deployments.core.rerank_jobs import RerankJob, RerankResult
from deployments.errors import PayloadTooLarge
from deployments.schemas_rerank import RerankQuery


def rerank_job(query: RerankQuery, model: RerankModelConfig, request_id: str) -> RerankJob:
    if len(query.documents) > model.max_documents:
        field = "texts" if query.dialect == "tei" else "documents"
        raise PayloadTooLarge(
            f"{len(query.documents)} documents in one request; model '{model.name}' "
            f"accepts at most {model.max_documents}.",
            param=field,
        )
    return RerankJob(
        query=query.query,
        documents=query.documents,
        max_tokens_per_doc=query.max_tokens_per_doc,
        first_chunk_only=query.first_chunk_only,
        job_id=uuid.uuid4().hex,
        request_id=request_id,
    )


def rerank_token_estimate(job: RerankJob) -> int:
    # The query is read once beside every document.
    return estimate_tokens(job.documents) + len(job.documents) * estimate_tokens([job.query])


def rerank_response(query: RerankQuery, model: str, result: RerankResult) -> Any:
    scores = result.raw if query.raw_scores else result.relevance
    # Best first; equal scores keep the documents' order.
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    if query.top_n is not None:
        order = order[: query.top_n]
    if query.dialect == "tei":
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
