"""The OpenAI embeddings route, POST /v1/embeddings, then the other dialects' routes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI

from deployments.http.common import install_model_route
from deployments.http.embed_dialects import install_embed_dialect_routes, too_many_inputs
from deployments.http.openapi import error_responses
from deployments.ingress.api.dialects import OPENAI_EMBEDDINGS
from deployments.ingress.api.schemas import EmbeddingResponse

if TYPE_CHECKING:
    from deployments.ingress.ingress import Ingress


def install_embedding_routes(app: FastAPI, ingress: Ingress) -> None:
    responses = {
        200: {"model": EmbeddingResponse},
        **error_responses({413: too_many_inputs(ingress, "inputs")}),
    }
    install_model_route(app, ingress, "/v1/embeddings", OPENAI_EMBEDDINGS, responses, "embeddings")
    install_embed_dialect_routes(app, ingress)
