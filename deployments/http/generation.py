"""The HTTP routes of generation: POST /v1/chat/completions and POST /v1/completions."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

from deployments.http.common import install_model_route
from deployments.http.openapi import error_responses
from deployments.ingress.api.dialects import OPENAI_CHAT, OPENAI_COMPLETIONS

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
    too_large = f"The body is over {ingress.config.ingress.max_body_bytes} bytes."
    responses: dict[int | str, dict[str, Any]] = {
        200: {
            "description": "A completion, or with `stream: true` server-sent events.",
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        },
        **error_responses({**GENERATION_ERRORS, 413: too_large}),
    }
    for path, name, dialect in (
        ("/v1/chat/completions", "chat_completions", OPENAI_CHAT),
        ("/v1/completions", "completions", OPENAI_COMPLETIONS),
    ):
        install_model_route(app, ingress, path, dialect, responses, name)
