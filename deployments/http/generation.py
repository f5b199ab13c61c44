"""The HTTP routes of generation: POST /v1/chat/completions and POST /v1/completions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from starlette.responses import Response, StreamingResponse

from deployments.http.common import json_response, read_call
from deployments.http.openapi import error_responses, json_request_body
from deployments.ingress.api.generation_schemas import ChatCompletionRequest, CompletionRequest

if TYPE_CHECKING:
    from deployments.ingress.ingress import Ingress

# What generation says beyond the other model routes (see http/openapi.py ERROR_MEANINGS).
GENERATION_ERRORS = {
    400: "Bad input (a wrong type, a value out of its range, an empty prompt, an unknown "
    "field), an unsupported field (n > 1, penalties, logprobs, echo, best_of > 1), "
    "max_tokens over the model's limit, or prompt + max_tokens over its context window.",
    503: "Realtime queue full, or the model's replica is not ready or restarting.",
    504: "The deadline passed before the first token.",
}


def install_generation_routes(app: FastAPI, ingress: Ingress) -> None:
    for path, chat, schema in (
        ("/v1/chat/completions", True, ChatCompletionRequest),
        ("/v1/completions", False, CompletionRequest),
    ):
        _route(app, ingress, path, chat, schema)


def _route(app: FastAPI, ingress: Ingress, path: str, chat: bool, schema: type) -> None:
    async def complete(request: Request) -> Response:
        ingress, meta, tenant, body = await read_call(request)
        answer = await ingress.generate(body, meta, tenant, chat)
        if answer.events is not None:
            headers = {**answer.headers, "Cache-Control": "no-cache"}
            return StreamingResponse(answer.events, media_type="text/event-stream", headers=headers)
        return json_response(answer.body, headers=answer.headers)

    config = ingress.config
    max_timeout_s = config.ingress.admission.max_timeout_s
    too_large = f"The body is over {config.ingress.max_body_bytes} bytes."
    app.post(
        path,
        openapi_extra=json_request_body(schema, max_timeout_s),
        responses={
            200: {
                "description": "A completion, or with `stream: true` server-sent events.",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **error_responses({**GENERATION_ERRORS, 413: too_large}),
        },
        name="chat_completions" if chat else "completions",
    )(complete)
