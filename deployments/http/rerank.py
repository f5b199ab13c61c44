"""The rerank routes in their three dialects: Cohere's /v1/rerank, Jina's /v2/rerank, TEI's
/rerank. The dialect only changes parsing and the answer's shape, both in ingress/."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from deployments.http.common import install_model_route
from deployments.http.openapi import error_responses
from deployments.ingress.api.dialects import COHERE_RERANK, JINA_RERANK, TEI_RERANK, Dialect
from deployments.ingress.api.rerank_schemas import RerankResponse, TeiRank

if TYPE_CHECKING:
    from deployments.ingress.ingress import Ingress


def install_rerank_routes(app: FastAPI, ingress: Ingress) -> None:
    config = ingress.config
    max_documents = ", ".join(f"{m.name}: {m.max_documents}" for m in config.rerank_models)
    too_large = error_responses(
        {
            413: f"The body is over {config.ingress.max_body_bytes} bytes, or it has more "
            f"documents than the model's max_documents ({max_documents or 'no rerank model'})."
        }
    )
    routes: tuple[tuple[str, str, Dialect, Any], ...] = (
        ("/v1/rerank", "rerank_v1", COHERE_RERANK, RerankResponse),
        ("/v2/rerank", "rerank_v2", JINA_RERANK, RerankResponse),
        ("/rerank", "rerank_tei", TEI_RERANK, list[TeiRank]),
    )
    for path, name, dialect, answer in routes:
        install_model_route(
            app, ingress, path, dialect, {200: {"model": answer}, **too_large}, name
        )
