"""The HTTP face of the ingress: a FastAPI app of thin routes over an `Ingress`.

The routes live one module per dialect family and read the ingress from `app.state`; this
module assembles them, answers errors in one shape, and gives `Ingress` its ASGI hook.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from deployments.errors import (
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    RouteNotFound,
    TributaryError,
    error_response,
)
from deployments.http.batches import install_batch_routes
from deployments.http.docs_pages import install_docs_pages
from deployments.http.embed_dialects import EMBED_DIALECT_REQUESTS
from deployments.http.embeddings import install_embedding_routes
from deployments.http.front_shedding import FrontDoorShares
from deployments.http.generation import install_generation_routes
from deployments.http.hot_routes import HotRouteFront
from deployments.http.openapi import install_openapi
from deployments.http.rerank import install_rerank_routes
from deployments.http.service import install_service_routes
from deployments.ingress.api.generation_schemas import ChatCompletionRequest, CompletionRequest
from deployments.ingress.api.rerank_schemas import RerankRequest, TeiRerankRequest
from deployments.ingress.api.schemas import EmbeddingRequest
from deployments.ingress.batches.line_runner import IngressLines
from deployments.ingress.batches.schemas import CreateBatchRequest
from deployments.ingress.batches.service import BatchService
from deployments.ingress.batches.stores import build_store
from deployments.ingress.ingress import Ingress

logger = logging.getLogger("ray.serve")

REQUEST_MODELS = (
    EmbeddingRequest,
    *EMBED_DIALECT_REQUESTS,
    RerankRequest,
    TeiRerankRequest,
    ChatCompletionRequest,
    CompletionRequest,
    CreateBatchRequest,
)


class HttpIngress(Ingress):
    """The ingress as Serve runs it: Serve calls `__serve_build_asgi_app__` on the replica
    and runs what it returns: the FastAPI app behind the hot routes' front (hot_routes.py).

    The hook lives here, not on `Ingress`, so that ingress/ never imports http/.
    """

    def __serve_build_asgi_app__(self) -> HotRouteFront:
        shedding = self.front_shedding
        front_door = None if shedding is None else FrontDoorShares(shedding)
        return HotRouteFront(build_http_app(self), answer_exception, front_door)


def build_http_app(ingress: Ingress) -> FastAPI:
    app = FastAPI(
        title="Tributary",
        summary="Batched serving of local models: OpenAI-compatible embeddings and "
        "completions; Cohere-, Jina- and TEI-compatible reranking.",
        version="0.1.0",
        # FastAPI's pages load from a CDN; docs_pages serves them from installed files.
        docs_url=None,
        redoc_url=None,
        lifespan=_lifespan,
    )
    app.state.ingress = ingress
    _install_error_handlers(app)
    install_openapi(app, REQUEST_MODELS, keys_required=not ingress.gate.is_open)
    install_embedding_routes(app, ingress)
    install_rerank_routes(app, ingress)
    install_generation_routes(app, ingress)
    batches = ingress.config.batches
    if batches.enabled:
        lines = IngressLines(ingress)
        service = BatchService(
            batches, lambda: build_store(batches), lines, ingress.observer.metrics
        )
        install_batch_routes(app, service)
    install_service_routes(app)
    install_docs_pages(app)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Serve runs the lifespan when the replica starts: batches left running by a replica
    # that died (or by the app before a restart) resume without waiting for a request.
    service: BatchService | None = getattr(app.state, "batches", None)
    if service is not None:
        service.start()
    yield
    if service is not None:
        await service.stop()


def answer_exception(exc: Exception) -> Response:
    """What a route's exception answers: its own error, or a 500 that says nothing of it."""
    if isinstance(exc, TributaryError):
        return error_response(exc)
    logger.error("unhandled error in the ingress", exc_info=exc)
    return error_response(InternalError())


def _install_error_handlers(app: FastAPI) -> None:
    async def tributary_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, TributaryError)
        return answer_exception(exc)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            return error_response(route_not_found(app, request.method, request.url.path))
        if exc.status_code == 405:
            return error_response(MethodNotAllowed("Method not allowed on this route."))
        return error_response(TributaryError(str(exc.detail), status=exc.status_code))

    async def validation_error(_: Request, exc: Exception) -> Response:
        return error_response(InvalidRequest("The request is not valid."))

    async def unexpected_error(_: Request, exc: Exception) -> Response:
        return answer_exception(exc)

    app.add_exception_handler(TributaryError, tributary_error)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected_error)


def route_not_found(app: FastAPI, method: str, path: str) -> RouteNotFound:
    """A 404 that names the request and lists every route there is, so a client of another
    dialect (or with a typo) sees at once what to call instead."""
    shown = path if len(path) <= 200 else path[:200] + "..."
    return RouteNotFound(f"No route {method} {shown}. The routes are: {route_list(app)}.")


def route_list(app: FastAPI) -> str:
    """`POST /v1/embeddings, GET /v1/models, ...` in the app's order. HEAD is left out (it
    mirrors GET) and so are the templated paths outside the API (the documentation
    assets); /v1/files/{file_id} and the like are in."""
    seen: list[str] = []
    for route in app.routes:
        path = getattr(route, "path", "")
        methods = getattr(route, "methods", None) or ()
        hidden = "{" in path and not getattr(route, "include_in_schema", False)
        for method in sorted(set(methods) - {"HEAD"}):
            entry = f"{method} {path}"
            if not hidden and entry not in seen:
                seen.append(entry)
    return ", ".join(seen)
