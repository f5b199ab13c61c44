"""What every route module shares: the ingress behind the app, reading a call, a model
route in any dialect, a JSON answer.

A leaf: the route modules import it, it imports none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from starlette.responses import Response, StreamingResponse

from deployments.errors import InvalidRequest, PayloadTooLarge
from deployments.http.openapi import json_request_body
from deployments.ingress.api.dialects import Dialect
from deployments.ingress.api.request_meta import RequestMeta, read_meta
from deployments.ingress.api.schemas import to_json

if TYPE_CHECKING:
    from deployments.core.access.access import Tenant
    from deployments.ingress.ingress import Ingress


def ingress_of(request: Request) -> Ingress:
    """The ingress that `build_http_app` put on the app; routes never close over it."""
    ingress: Ingress = request.app.state.ingress
    return ingress


def json_response(
    body: Any, status: int = 200, headers: dict[str, str] | None = None, head: bool = False
) -> Response:
    content = b"" if head else to_json(body)
    return Response(content, status_code=status, media_type="application/json", headers=headers)


def install_model_route(
    app: FastAPI,
    ingress: Ingress,
    path: str,
    dialect: Dialect,
    responses: dict[int | str, dict[str, Any]],
    name: str,
) -> None:
    """POST `path`: a request in `dialect` to its task's model. `ingress` only words the
    OpenAPI document; the route reads the ingress from app.state."""

    async def call_model(request: Request) -> Response:
        ingress, meta, tenant, body = await read_call(request)
        answer = await ingress.answer(dialect, body, meta, tenant)
        if answer.events is not None:
            headers = {**answer.headers, "Cache-Control": "no-cache"}
            return StreamingResponse(answer.events, media_type="text/event-stream", headers=headers)
        return json_response(answer.body, headers=answer.headers)

    max_timeout_s = ingress.config.ingress.admission.max_timeout_s
    app.post(
        path,
        openapi_extra=json_request_body(dialect.request, max_timeout_s),
        responses=responses,
        name=name,
    )(call_model)


async def read_call(request: Request) -> tuple[Ingress, RequestMeta, Tenant | None, bytes]:
    """The ingress, the headers, the caller (checked before reading a body a stranger sent)
    and the body."""
    ingress = ingress_of(request)
    meta = read_meta(request.headers, ingress.config.ingress.admission.max_timeout_s)
    tenant = ingress.gate.authenticate(meta.authorization)
    body = await read_body(request, ingress.config.ingress.max_body_bytes)
    return ingress, meta, tenant, body


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
