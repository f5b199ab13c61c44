"""The HTTP surface of the ingress: thin FastAPI routes over an `Ingress` instance."""

from __future__ import annotations

import logging
from importlib import resources
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from deployments.errors import (
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    PayloadTooLarge,
    RouteNotFound,
    TributaryError,
    error_response,
)
from deployments.http.openapi import error_responses, install_openapi, json_request_body
from deployments.ingress.embeddings import to_json
from deployments.ingress.generation_schemas import ChatCompletionRequest, CompletionRequest
from deployments.ingress.rerank_schemas import (
    Dialect,
    RerankRequest,
    RerankResponse,
    TeiRank,
    TeiRerankRequest,
)
from deployments.ingress.schemas import EmbeddingRequest, EmbeddingResponse, ErrorBody, ModelList

if TYPE_CHECKING:
    from deployments.core.access import Tenant
    from deployments.ingress.ingress import Ingress
    from deployments.ingress.request_meta import RequestMeta

logger = logging.getLogger("ray.serve")

REQUEST_MODELS = (
    EmbeddingRequest,
    RerankRequest,
    TeiRerankRequest,
    ChatCompletionRequest,
    CompletionRequest,
)


def build_http_app(ingress: Ingress) -> FastAPI:
    app = FastAPI(
        title="Tributary",
        summary="Batched serving of local models: OpenAI-compatible embeddings and "
        "completions; Cohere-, Jina- and TEI-compatible reranking.",
        version="0.1.0",
    )
    _install_error_handlers(app)
    install_openapi(app, REQUEST_MODELS, keys_required=not ingress.access.is_open)
    config = ingress.config
    max_timeout_s = config.ingress.admission.max_timeout_s
    body_limit = f"The body is over {ingress.max_body_bytes} bytes"
    max_inputs = ", ".join(f"{m.name}: {m.max_inputs}" for m in config.embedding_models)
    max_documents = ", ".join(f"{m.name}: {m.max_documents}" for m in config.rerank_models)

    @app.post(
        "/v1/embeddings",
        openapi_extra=json_request_body(EmbeddingRequest, max_timeout_s),
        responses={
            200: {"model": EmbeddingResponse},
            **error_responses(
                {
                    413: f"{body_limit}, or it has more inputs than the model's max_inputs "
                    f"({max_inputs})."
                }
            ),
        },
    )
    async def embeddings(request: Request) -> Response:
        meta, tenant, body = await read_call(ingress, request)
        answer = await ingress.embed(body, meta, tenant)
        return json_response(answer.body, headers=answer.headers)

    def rerank_route(path: str, dialect: Dialect, schema: type, answer: Any) -> None:
        async def rerank(request: Request) -> Response:
            meta, tenant, body = await read_call(ingress, request)
            result = await ingress.rerank(body, meta, tenant, dialect)
            return json_response(result.body, headers=result.headers)

        app.post(
            path,
            openapi_extra=json_request_body(schema, max_timeout_s),
            responses={
                200: {"model": answer},
                **error_responses(
                    {
                        413: f"{body_limit}, or it has more documents than the model's "
                        f"max_documents ({max_documents or 'no rerank model'})."
                    }
                ),
            },
            name=f"rerank_{dialect}",
        )(rerank)

    rerank_route("/v1/rerank", "v1", RerankRequest, RerankResponse)
    rerank_route("/v2/rerank", "v2", RerankRequest, RerankResponse)
    rerank_route("/rerank", "tei", TeiRerankRequest, list[TeiRank])

    from deployments.http.generation import install_generation_routes

    install_generation_routes(app, ingress)

    # HEAD where a load balancer or a probe may use it: the status of GET, no body. One
    # route per method, so that each has its own operationId in the OpenAPI document.
    async def models(request: Request) -> Response:
        return json_response(ingress.list_models(), head=request.method == "HEAD")

    async def healthz(request: Request) -> Response:
        head = request.method == "HEAD"
        try:
            await ingress.health()
        except TributaryError as exc:
            if not head:
                raise
            return Response(status_code=exc.status, headers=exc.headers())
        return json_response({"status": "ok"}, head=head)

    health_responses: dict[int | str, dict[str, Any]] = {
        200: {"description": 'Ready: `{"status": "ok"}`.'},
        503: {"model": ErrorBody, "description": "A deployment is not ready."},
    }
    for route in (app.get, app.head):
        route("/v1/models", responses={200: {"model": ModelList}})(models)
        route("/healthz", responses=health_responses)(healthz)

    @app.get("/v1/stats")
    async def stats() -> Response:
        return json_response(await ingress.stats())

    status_page = resources.files("deployments").joinpath("static/status.html").read_bytes()

    @app.get("/status", include_in_schema=False)
    async def status() -> Response:
        # A live view of /v1/stats for humans; the page fetches it every 2 s.
        return Response(status_page, media_type="text/html; charset=utf-8")

    return app


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None, head: bool = False
) -> Response:
    content = b"" if head else to_json(body)
    return Response(content, status_code=status, media_type="application/json", headers=headers)


async def read_call(ingress: Ingress, request: Request) -> tuple[RequestMeta, Tenant | None, bytes]:
    """The headers, the caller (checked before reading a body a stranger sent) and the body."""
    meta = ingress.read_meta(request.headers)
    tenant = ingress.authenticate(meta)
    body = await read_body(request, ingress.max_body_bytes)
    return meta, tenant, body


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise InvalidRequest("Content-Length is not a number.")
        if int(declared) > limit:
            raise _too_large(int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"The request body is {size} bytes or more; the limit is {limit}.")


def _install_error_handlers(app: FastAPI) -> None:
    async def tributary_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, TributaryError)
        return error_response(exc)

    async def http_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return error_response(RouteNotFound("No such route."))
        if exc.status_code == 405:
            return error_response(MethodNotAllowed("Method not allowed on this route."))
        return error_response(TributaryError(str(exc.detail), status=exc.status_code))

    async def validation_error(_: Request, exc: Exception) -> Response:
        return error_response(InvalidRequest("The request is not valid."))

    async def unexpected_error(_: Request, exc: Exception) -> Response:
        logger.error("unhandled error in the ingress", exc_info=exc)
        return error_response(InternalError())

    app.add_exception_handler(TributaryError, tributary_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected_error)
