"""Request and response shapes of the HTTP API; one pydantic base for all of them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

from deployments.errors import InvalidRequest

TokenIds = list[StrictInt]


class ApiModel(BaseModel):
    # An unknown field is most likely a typo or a feature we lack: say so rather than
    # silently ignore it.
    model_config = ConfigDict(extra="forbid")


class EmbeddingRequest(ApiModel):
    model: StrictStr = Field(..., description="A model name from GET /v1/models.")
    input: StrictStr | list[StrictStr] | TokenIds | list[TokenIds] = Field(
        ...,
        description="A text, a list of texts, one list of token ids, or a list of them. "
        "Token ids are the model's own vocabulary, without special tokens.",
    )
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="`base64`: little-endian float32 bytes, base64-encoded."
    )
    dimensions: int | None = Field(
        None,
        ge=1,
        description="Keep the first N components and re-normalise to unit length.",
    )
    user: str | None = Field(None, description="Accepted for OpenAI compatibility; unused.")
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
    "'input' must be a non-empty string, a non-empty array of strings, an array of "
    "token ids, or an array of token-id arrays"
)


def parse_embedding_request(body: bytes) -> EmbeddingRequest:
    """Validate a raw JSON body, turning pydantic's report into one clear 400."""
    try:
        return EmbeddingRequest.model_validate_json(body)
    except ValidationError as exc:
        raise _as_invalid_request(exc) from None


def _as_invalid_request(
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
    if field in shapes and kind != "missing":
        return InvalidRequest(shapes[field], param=field)
    if kind == "missing":
        return InvalidRequest(f"Missing required parameter '{field}'.", param=field)
    if kind == "extra_forbidden":
        return InvalidRequest(f"Unrecognized request argument '{field}'.", param=field)
    return InvalidRequest(f"Invalid '{field}': {first['msg']}.", param=field)
