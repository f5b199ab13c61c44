"""The OpenAPI document of the HTTP app: FastAPI's, plus what FastAPI cannot see.

The model routes read their JSON body themselves (size limit first, one clear 400), so
FastAPI knows neither their request schemas nor the headers they read. Here each route
states its body as a `$ref` into `components/schemas`, the request models (and every
model they nest) are added there, and each route lists the statuses it can answer with
the error body, `Retry-After` where it is sent, and the limits that are known statically.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from deployments.ingress.api.schemas import ErrorBody

REF_TEMPLATE = "#/components/schemas/{model}"

_RETRY_AFTER = {
    "Retry-After": {
        "description": "Whole seconds to wait before trying again (at least 1).",
        "schema": {"type": "integer", "minimum": 1},
    }
}
_WWW_AUTHENTICATE = {"WWW-Authenticate": {"description": "`Bearer`.", "schema": {"type": "string"}}}

# What each status means on every model route; a route may say more (see `error_responses`).
ERROR_MEANINGS: dict[int, str] = {
    400: "Bad input: malformed JSON, a body that is not an object, an unknown field, a wrong "
    "type (a bool or a string is never a number), a value out of its range, an empty input, "
    "too long a text, a malformed X-Priority or X-Request-Timeout header, an X-Priority that "
    "disagrees with the body's `priority`.",
    401: "API keys are configured and the request has none or a wrong one.",
    403: "The API key may not use this model.",
    404: "Unknown model.",
    413: "Body, number of inputs or of documents over the configured limit; or "
    "`input_too_large_for_memory`, an input that ran out of the model's memory even alone.",
    429: "The key's rate limit, or the server sheds this priority class or its queue is full "
    "(normal and batch classes).",
    500: "The model failed on a batch holding this request (the detail is logged, never sent).",
    503: "Realtime queue full or Serve back-pressure, or a model replica is not ready.",
    504: "The request's deadline (X-Request-Timeout or the class default) passed.",
}


def error_responses(overrides: dict[int, str] | None = None) -> dict[int | str, dict[str, Any]]:
    """FastAPI `responses` for every error status of a model route."""
    meanings = {**ERROR_MEANINGS, **(overrides or {})}
    responses: dict[int | str, dict[str, Any]] = {}
    for status, meaning in meanings.items():
        response: dict[str, Any] = {"model": ErrorBody, "description": meaning}
        if status in (429, 503):
            response["headers"] = _RETRY_AFTER
        if status == 401:
            response["headers"] = _WWW_AUTHENTICATE
        responses[status] = response
    return responses


def json_request_body(schema: type[BaseModel], max_timeout_s: float) -> dict[str, Any]:
    """`openapi_extra` of a route that reads its JSON body and headers itself."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": REF_TEMPLATE.format(model=schema.__name__)}}
            },
        },
        "parameters": _header_parameters(max_timeout_s),
    }


def _header_parameters(max_timeout_s: float) -> list[dict[str, Any]]:
    return [
        {
            "name": "X-Priority",
            "in": "header",
            "required": False,
            "description": "Priority class, capped by the API key's tier (also the body field "
            "`priority`; both must agree). Default normal.",
            "schema": {"type": "string", "enum": ["realtime", "normal", "batch"]},
        },
        {
            "name": "X-Request-Timeout",
            "in": "header",
            "required": False,
            "description": "The request's deadline in seconds; default the class's timeout.",
            "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": max_timeout_s},
        },
        {
            "name": "X-Request-ID",
            "in": "header",
            "required": False,
            "description": "Echoed in the response; shown in /v1/stats when a request is dropped.",
            "schema": {"type": "string"},
        },
    ]


def install_openapi(
    app: FastAPI, request_models: Iterable[type[BaseModel]], keys_required: bool
) -> None:
    """Make `app.openapi()` (and so GET /openapi.json) the complete document."""
    models = list(request_models)
    generate = app.openapi  # FastAPI's own, which caches its result in app.openapi_schema

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()
            components = document.setdefault("components", {})
            _add_schemas(components.setdefault("schemas", {}), models)
            if keys_required:
                _require_bearer(document, components)
        schema = app.openapi_schema
        assert schema is not None  # generate() stored it
        return schema

    # Replacing the method is how FastAPI documents customising the OpenAPI document.
    app.openapi = openapi  # type: ignore[method-assign]


def _add_schemas(schemas: dict[str, Any], models: list[type[BaseModel]]) -> None:
    _, top = models_json_schema([(m, "validation") for m in models], ref_template=REF_TEMPLATE)
    for name, schema in top.get("$defs", {}).items():
        known = schemas.get(name)
        if known is not None and known != schema:
            # Two shapes under one name would silently describe one of them wrongly.
            raise RuntimeError(f"OpenAPI schema '{name}' has two different definitions")
        schemas[name] = schema


def _require_bearer(document: dict[str, Any], components: dict[str, Any]) -> None:
    components["securitySchemes"] = {
        "apiKey": {"type": "http", "scheme": "bearer", "description": "An API key."}
    }
    for path, methods in document.get("paths", {}).items():
        for operation in methods.values():
            # The model routes and the Batch API; health, models, stats are open.
            if "requestBody" in operation or path.startswith(("/v1/files", "/v1/batches")):
                operation["security"] = [{"apiKey": []}]
