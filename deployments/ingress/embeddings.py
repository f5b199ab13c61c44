"""Build response bodies as plain dicts of numpy arrays, serialised by orjson in one pass."""

from __future__ import annotations

from typing import Any

import orjson

from deployments.core.jobs import EmbedResult
from deployments.core.vectors import shrink_dimensions, to_base64
from deployments.errors import InvalidRequest
from deployments.ingress.schemas import EmbeddingRequest


def embedding_response(result: EmbedResult, request: EmbeddingRequest) -> dict[str, Any]:
    width = result.vectors.shape[1]
    if request.dimensions is not None and request.dimensions > width:
        raise InvalidRequest(
            f"'dimensions' is {request.dimensions}; model '{request.model}' has {width}.",
            param="dimensions",
        )
    vectors = shrink_dimensions(result.vectors, request.dimensions)
    as_base64 = request.encoding_format == "base64"
    truncated = set(result.truncated)
    data: list[dict[str, Any]] = []
    for index, vector in enumerate(vectors):
        entry: dict[str, Any] = {
            "object": "embedding",
            "index": index,
            "embedding": to_base64(vector) if as_base64 else vector,
        }
        if index in truncated:
            entry["truncated"] = True
        data.append(entry)
    tokens = sum(result.token_counts)
    return {
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {
            "prompt_tokens": tokens,
            "total_tokens": tokens,
            "truncated_inputs": len(truncated),
        },
    }


def to_json(body: Any) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
