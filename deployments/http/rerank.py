"""The rerank routes in their three dialects: Cohere's /v1/rerank, Jina's /v2/rerank, TEI's
/rerank. The dialect only changes parsing and the answer's shape, both in ingress/."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from starlette.responses import Response

from deployments.http.common import json_response, read_call
from deployments.http.openapi import error_responses, json_request_body
from deployments.ingress.api.rerank_schemas import (
    Dialect,
    RerankRequest,
    RerankResponse,
    TeiRank,
    TeiRerankRequest,
)

if TYPE_CHECKING:
    from deployments.ingress.ingress import Ingress


def install_rerank_routes(app: FastAPI, ingress: Ingress) -> None:
    routes: tuple[tuple[str, Dialect, type, Any], ...] = (
        ("/v1/rerank", "v1", RerankRequest, RerankResponse),
        ("/v2/rerank", "v2", RerankRequest, RerankResponse),
        ("/rerank", "tei", TeiRerankRequest, list[TeiRank]),
    )
    for path, dialect, schema, answer in routes:
        _route(app, ingress, path, dialect, schema, answer)


def _route(
    app: FastAPI, ingress: Ingress, path: str, dialect: Dialect, schema: type, answer: Any
) -> None:
    async def rerank(request: Request) -> Response:
        ingress, meta, tenant, body = await read_call(request)
        result = await ingress.rerank(body, meta, tenant, dialect)
        return json_response(result.body, headers=result.headers)

    config = ingress.config
    max_documents = ", ".join(f"{m.name}: {m.max_documents}" for m in config.rerank_models)
    app.post(
        path,
        openapi_extra=json_request_body(schema, config.ingress.admission.max_timeout_s),
        responses={
            200: {"model": answer},
            **error_responses(
                {
                    413: f"The body is over {config.ingress.max_body_bytes} bytes, or it has more "
                    f"documents than the model's max_documents "
                    f"({max_documents or 'no rerank model'})."
                }
            ),
        },
        name=f"rerank_{dialect}",
    )(rerank)
