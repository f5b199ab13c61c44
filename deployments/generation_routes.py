"""The HTTP routes of generation: POST /v1/chat/completions and POST /v1/completions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from starlette.responses import Response, StreamingResponse

from deployments.http_app import ERROR_RESPONSES, json_request_body, json_response, read_call
from deployments.schemas_generation import ChatCompletionRequest, CompletionRequest

if TYPE_CHECKING:
    from deployments.ingress import Ingress

GENERATION_ERRORS = {
    **ERROR_RESPONSES,
    400: {
        **ERROR_RESPONSES[400],
        "description": "Bad input, an unsupported field (n > 1, penalties, logprobs, echo), "
        "max_tokens over the model's limit, or prompt + max_tokens over its context window.",
    },
    504: {
        **ERROR_RESPONSES[504],
        "description": "The deadline passed before the first token.",
    },
}


def install_generation_routes(app: FastAPI, ingress: Ingress) -> None:
    for path, chat, schema in (
        ("/v1/chat/completions", True, ChatCompletionRequest),
        ("/v1/completions", False, CompletionRequest),
    ):
        _route(app, ingress, path, chat, schema)


def _route(app: FastAPI, ingress: Ingress, path: str, chat: bool, schema: type) -> None:
    async def complete(request: Request) -> Response:
        meta, tenant, body = await read_call(ingress, request)
        answer = await ingress.generate(body, meta, tenant, chat)
        if answer.events is not None:
            headers = {**answer.headers, "Cache-Control": "no-cache"}
            return StreamingResponse(answer.events, media_type="text/event-stream", headers=headers)
        return json_response(answer.body, headers=answer.headers)

    app.post(
        path,
        openapi_extra=json_request_body(schema),
        responses={
            200: {"description": "A completion, or server-sent events"},
            **GENERATION_ERRORS,
        },
        name="chat_completions" if chat else "completions",
    )(complete)
