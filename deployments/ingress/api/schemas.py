"""Request and response shapes of the HTTP API; one pydantic base for all of them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
)

from deployments.errors import InvalidRequest

# Bounds that hold whatever the model. A field whose real limit is the model's (the vector
# size, max_tokens_limit, max_documents) is checked after parsing, by a message naming that
# limit; the bound here only keeps every value representable downstream (int32 tensors).
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# Strict: a bool is never a number and a string never a number (pydantic's lax mode turns
# "8" into 8 and true into 1). An integer is a valid float; NaN and infinities (JSON's
# `1e999` parses to inf) are not.
Count = Annotated[StrictInt, Field(ge=1, le=INT32_MAX)]
Number = Annotated[StrictFloat, Field(allow_inf_nan=False)]
NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
TokenId = Annotated[StrictInt, Field(ge=0, le=INT32_MAX)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]


class ApiModel(BaseModel):
    # An unknown field is most likely a typo or a feature we lack: say so rather than
    # silently ignore it.
    model_config = ConfigDict(extra="forbid")


class EmbeddingRequest(ApiModel):
    model: StrictStr = Field(..., description="A model name from GET /v1/models.")
    input: (
        NonEmptyStr
        | Annotated[list[NonEmptyStr], Field(min_length=1)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1)]
    ) = Field(
        ...,
        description="A text, a list of texts, one list of token ids, or a list of them; "
        "nothing empty. Token ids only where the model's config has `accept_token_ids: "
        "true` (otherwise 400 `token_ids_not_accepted`: send text); they are the model's "
        "own vocabulary, without special tokens. At most the model's `max_inputs` inputs "
        "(413).",
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="`base64`: little-endian float32 bytes, base64-encoded."
    )
    dimensions: Count | None = Field(
        None,
        description="Keep the first N components and re-normalise to unit length; at most "
        "the model's own size (400).",
    )
    user: StrictStr | None = Field(
        None, description="End-user id; keeps that user on one model version (sticky)."
    )
    priority: Literal["realtime", "normal", "batch"] | None = Field(
        None,
        description="Priority class (same as the X-Priority header); capped by the API "
        "key's tier. Default normal.",
    )


class EmbeddingData(ApiModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str
    truncated: bool | None = Field(
        None, description="Present and true when the input was cut to the model window."
    )


class EmbeddingUsage(ApiModel):
    prompt_tokens: int
    total_tokens: int
    truncated_inputs: int = Field(0, description="How many inputs were cut to fit.")


class EmbeddingResponse(ApiModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class ModelCard(ApiModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tributary"
    task: Literal["embedding", "rerank", "generation"]


class ModelList(ApiModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(ApiModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(ApiModel):
    error: ErrorDetail


INPUT_SHAPE = (
    "'input' must be a non-empty string, a non-empty array of non-empty strings, a "
    f"non-empty array of token ids (integers 0 to {INT32_MAX}), or a non-empty array of them"
)


def as_invalid_request(
    exc: ValidationError, shapes: dict[str, str] | None = None
) -> InvalidRequest:
    """One 400 from pydantic's first complaint; `shapes` gives, per field whose accepted
    shapes are several, the sentence that says them all (pydantic lists every branch)."""
    shapes = {"input": INPUT_SHAPE} if shapes is None else shapes
    first = exc.errors(include_url=False)[0]
    kind = first["type"]
    if kind == "json_invalid":
        return InvalidRequest(f"The body is not valid JSON: {first['msg']}.")
    if kind == "model_type":
        return InvalidRequest("The body must be a JSON object.")
    field = str(first["loc"][0]) if first["loc"] else None
    if kind in ("string_too_short", "too_short") and first["ctx"].get("min_length") == 1:
        return InvalidRequest(f"'{field}' must not be empty.", param=field)
    if field in shapes and kind != "missing":
        return InvalidRequest(shapes[field], param=field)
    if kind == "missing":
        return InvalidRequest(f"Missing required parameter '{field}'.", param=field)
    if kind == "extra_forbidden":
        return InvalidRequest(f"Unrecognized request argument '{field}'.", param=field)
    return InvalidRequest(f"Invalid '{_path(first['loc'])}': {first['msg']}.", param=field)


# The names pydantic gives the branches of a union in an error's location.
_BRANCH_TAGS = {"str", "int", "float", "bool"}


def _path(loc: tuple[int | str, ...]) -> str:
    """`stream_options.include_usage`, `messages[0].name`: where in the body, as OpenAI
    writes it, up to the first union branch tag."""
    path = str(loc[0])
    for part in loc[1:]:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.isidentifier() and part not in _BRANCH_TAGS:
            path += f".{part}"
        else:
            break
    return path


def to_json(body: Any) -> bytes:
    """An answer as JSON bytes in one pass: numpy vectors included, as orjson writes them."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
