"""The hot routes tell HAProxy the share to refuse: a key whose requests admission keeps
refusing publishes a growing share with the refusals' Retry-After; the share HAProxy says
it applied counts as load the ingress never saw; other keys and realtime are apart."""

from __future__ import annotations

import httpx
from fastapi import FastAPI, Request
from starlette.responses import Response

from deployments.core.admission.front_shedding import FrontShedding
from deployments.errors import Overloaded
from deployments.http.front_shedding import FrontDoorShares
from deployments.http.hot_routes import HotRouteFront
from deployments.http.server import answer_exception


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def app_admitting(every: int, clock: Clock) -> tuple[HotRouteFront, FrontShedding]:
    """Admits one request in `every` on /v1/embeddings; refuses the rest for 3 s."""
    app = FastAPI()
    seen = [0]

    @app.post("/v1/embeddings")
    async def embed(request: Request) -> Response:
        seen[0] += 1
        if seen[0] % every:
            raise Overloaded("busy", retry_after_s=3, status=429, code="load_shed")
        return Response(b"{}", media_type="application/json")

    shedding = FrontShedding(headroom=1.25, clock=clock)
    return HotRouteFront(app, answer_exception, FrontDoorShares(shedding)), shedding


async def test_refusals_raise_the_published_share_of_their_key_alone() -> None:
    clock = Clock()
    front, shedding = app_admitting(every=4, clock=clock)
    transport = httpx.ASGITransport(app=front)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        for _ in range(40):
            clock.now += 0.1
            answer = await client.post("/v1/embeddings", headers={"X-Priority": "batch"})
        realtime = await client.post("/v1/embeddings", headers={"X-Priority": "realtime"})
    # A quarter admitted: HAProxy should let 1.25 x that through, refusing ~69 % of it.
    assert int(answer.headers["x-tributary-shed"]) > 300
    assert answer.headers["x-tributary-shed-retry"] == "3"
    assert "x-tributary-shed" not in realtime.headers
    assert set(shedding.shares()) == {"embed_batch"}


async def test_the_share_haproxy_applied_counts_as_load_before_it() -> None:
    """Half admitted of what arrived, but HAProxy had already refused half of the
    offered load: admission saw only what it needed (1.25 x), so the share holds."""
    clock = Clock()
    front, shedding = app_admitting(every=2, clock=clock)
    transport = httpx.ASGITransport(app=front)
    headers = {"X-Tributary-Front-Shed": "750"}
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as client:
        for _ in range(40):
            clock.now += 0.1
            await client.post("/v1/embeddings", headers=headers)
    # Offered = 4 x arrivals, admitted = arrivals / 2: wanted 1.25 x that is 16 % of
    # the offered load, so the share climbs towards 84 %, above what was applied.
    assert shedding.shares()["embed_none"] > 0.5
