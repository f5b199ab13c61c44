"""calls/apart.py: calls made inside carry a request id of their own, so Serve's cancel of
the request that made them does not reach them; the request's own context comes back after."""

from __future__ import annotations

from ray.serve import context

from deployments.ingress.calls.apart import apart_from_request


def test_inside_a_call_has_an_id_of_its_own_and_the_request_keeps_its_own() -> None:
    request = context._RequestContext(request_id="client-id", _internal_request_id="parent")
    token = context._serve_request_context.set(request)
    try:
        with apart_from_request():
            inside = context._get_serve_request_context()
            with apart_from_request():
                nested = context._get_serve_request_context()
        after = context._get_serve_request_context()
    finally:
        context._serve_request_context.reset(token)
    assert inside._internal_request_id not in ("", "parent")
    assert nested._internal_request_id not in ("", "parent", inside._internal_request_id)
    assert inside.request_id == "client-id"  # the client's id still names it in logs
    assert after is request
