"""The request shape of POST /v1/batches, as OpenAI defines it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictStr, ValidationError

from deployments.errors import InvalidRequest
from deployments.ingress.api.schemas import ApiModel, NonEmptyStr, as_invalid_request
from deployments.ingress.batches.line_runner import ENDPOINTS

Endpoint = Literal[
    "/v1/embeddings", "/v1/chat/completions", "/v1/completions", "/v1/rerank", "/v2/rerank"
]
assert set(Endpoint.__args__) == set(ENDPOINTS)  # type: ignore[attr-defined]

# OpenAI's bounds on metadata: 16 pairs, keys up to 64 characters, values up to 512.
MetadataKey = Annotated[StrictStr, Field(max_length=64)]
MetadataValue = Annotated[StrictStr, Field(max_length=512)]

SHAPES = {
    "endpoint": f"'endpoint' must be one of {', '.join(sorted(ENDPOINTS))}.",
    "completion_window": "'completion_window' must be '24h'.",
    "metadata": "'metadata' must be an object of at most 16 string values (keys up to 64 "
    "characters, values up to 512).",
}


class CreateBatchRequest(ApiModel):
    input_file_id: NonEmptyStr
    endpoint: Endpoint
    completion_window: Literal["24h"]
    metadata: Annotated[dict[MetadataKey, MetadataValue], Field(max_length=16)] | None = None
    # Accepted for the client's sake; produced files are kept until deleted.
    output_expires_after: dict[str, Any] | None = None


def parse_create_batch(body: bytes) -> CreateBatchRequest:
    try:
        return CreateBatchRequest.model_validate_json(body)
    except ValidationError as exc:
        raise as_invalid_request(exc, SHAPES) from None


def parse_limit(raw: str | None) -> int:
    if raw is None:
        return 20
    if not raw.isdigit() or not 1 <= int(raw) <= 100:
        raise InvalidRequest("'limit' must be an integer from 1 to 100.", param="limit")
    return int(raw)
