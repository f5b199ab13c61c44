"""The OpenAI embeddings route, POST /v1/embeddings, then the other dialects' routes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from starlette.responses import Response

from deployments.http.common import json_response, read_call
from deployments.http.embed_dialects import install_embed_dialect_routes
from deployments.http.openapi import error_responses, json_request_body
from deployments.ingress.api.schemas import EmbeddingRequest, EmbeddingResponse

if TYPE_CHECKING:
    from deployments.ingress.ingress import Ingress


def install_embedding_routes(app: FastAPI, ingress: Ingress) -> None:
    # `ingress` only words the OpenAPI document; the route reads it from app.state.
    config = ingress.config
    max_inputs = ", ".join(f"{m.name}: {m.max_inputs}" for m in config.embedding_models)

    async def embeddings(request: Request) -> Response:
        ingress, meta, tenant, body = await read_call(request)
        answer = await ingress.embed(body, meta, tenant, "openai")
        return json_response(answer.body, headers=answer.headers)

    app.post(
        "/v1/embeddings",
        openapi_extra=json_request_body(EmbeddingRequest, config.ingress.admission.max_timeout_s),
        responses={
            200: {"model": EmbeddingResponse},
            **error_responses(
                {
                    413: f"The body is over {config.ingress.max_body_bytes} bytes, or it has more "
                    f"inputs than the model's max_inputs ({max_inputs or 'no embedding model'})."
                }
            ),
        },
    )(embeddings)
    install_embed_dialect_routes(app, ingress)
