"""The embedding and rerank routes without Starlette's per-request machinery.

A single-text embedding is a few hundred microseconds of work for the ingress, and a
profile under 64 concurrent clients put half of the route's share of the event loop in
the layers around it: seven middlewares, the router's regex walk over every route,
FastAPI's request handler, and Serve naming the route for its metrics by the same walk.
None of them does anything for these routes, whose endpoints take the raw `Request`,
parse their own bodies and raise only `TributaryError`.

`HotRouteFront` is the ASGI app Serve runs: a POST to one of `HOT_PATHS` calls that
route's endpoint directly, the very function FastAPI would call, and answers its
exceptions the way the app's handlers do (`server.answer_exception`), so the bytes on the
wire are the same (tests/integration/test_hot_routes.py compares them). Everything else
(other routes, lifespan, OpenAPI, 404s and 405s) goes to the FastAPI app unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import Receive, Scope, Send

from deployments.errors import NotReady, Overloaded
from deployments.http.front_shedding import FrontDoorShares

# Every route whose endpoint reads the raw request and answers with one JSON response.
HOT_PATHS = frozenset(
    {
        "/v1/embeddings",
        "/v1/embed",
        "/v2/embed",
        "/embed",
        "/",
        "/v1/rerank",
        "/v2/rerank",
        "/rerank",
    }
)

INTERRUPTED = NotReady("The request was interrupted inside the server; retry shortly.")

Endpoint = Callable[[Request], Awaitable[Response]]
ErrorAnswer = Callable[[Exception], Response]


class _HotRoute:
    """What Serve's route naming (`get_asgi_route_name`) reads of a route: a path and
    `matches`. One dictionary lookup instead of a regex walk over every route."""

    def __init__(self, path: str) -> None:
        self.path = path

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        hit = scope.get("method") == "POST" and scope.get("path") == self.path
        return (Match.FULL if hit else Match.NONE), {}


class HotRouteFront:
    def __init__(
        self,
        app: FastAPI,
        answer_exception: ErrorAnswer,
        front_door: FrontDoorShares | None = None,
    ) -> None:
        self.app = app
        self._answer_exception = answer_exception
        self._front_door = front_door
        self._endpoints: dict[str, Endpoint] = {
            route.path: route.endpoint
            for route in app.routes
            if isinstance(route, APIRoute)
            and route.path in HOT_PATHS
            and "POST" in (route.methods or ())
        }
        # Serve names each request's route for its metrics from `routes` and `router`.
        self.routes = [_HotRoute(path) for path in self._endpoints] + list(app.routes)
        self.router = app.router

    @property
    def hot_paths(self) -> frozenset[str]:
        return frozenset(self._endpoints)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = (
            self._endpoints.get(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path")
            else None
        )
        if endpoint is None:
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app  # what Starlette sets, and `ingress_of` reads
        refused_retry_after_s: int | None = None
        try:
            response = await endpoint(Request(scope, receive))
        except Exception as exc:
            response = self._answer_exception(exc)
            if isinstance(exc, Overloaded):
                refused_retry_after_s = int(response.headers.get("retry-after", "1"))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise  # the client left and Serve cancelled this handler: nobody to answer
            # A cancellation from inside that nobody asked for; left to the HTTP server it
            # would become a bare text 500 while the client is still waiting.
            response = self._answer_exception(INTERRUPTED)
        if self._front_door is not None and (keyed := self._front_door.key_of(scope)):
            key, applied = keyed
            self._front_door.stamp(response, key, applied, refused_retry_after_s)
        await response(scope, receive, send)
