"""The service routes: /v1/models, /healthz, /v1/stats and the /status page."""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import FastAPI, Request
from starlette.responses import Response

from deployments.errors import TributaryError
from deployments.http.batches import batch_summary
from deployments.http.common import ingress_of, json_response
from deployments.ingress.api.schemas import ErrorBody, ModelList


def install_service_routes(app: FastAPI) -> None:
    # HEAD where a load balancer or a probe may use it: the status of GET, no body. One
    # route per method, so that each has its own operationId in the OpenAPI document.
    async def models(request: Request) -> Response:
        ingress = ingress_of(request)
        return json_response(ingress.list_models(), head=request.method == "HEAD")

    async def healthz(request: Request) -> Response:
        head = request.method == "HEAD"
        try:
            await ingress_of(request).health.check()
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
    async def stats(request: Request) -> Response:
        stats = await ingress_of(request).stats.gather()
        batches = await batch_summary(request)
        return json_response(stats if batches is None else {**stats, "batches": batches})

    status_page = resources.files("deployments").joinpath("static/status.html").read_bytes()

    @app.get("/status", include_in_schema=False)
    async def status() -> Response:
        # A live view of /v1/stats for humans; the page fetches it every 2 s.
        return Response(status_page, media_type="text/html; charset=utf-8")
