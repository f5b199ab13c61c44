"""What every route module shares: the ingress behind the app, reading a call, a JSON answer.

A leaf: the route modules import it, it imports none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import Request
from starlette.responses import Response

from deployments.errors import InvalidRequest, PayloadTooLarge
from deployments.ingress.api.request_meta import RequestMeta, read_meta
from deployments.ingress.tasks.embeddings import to_json

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
