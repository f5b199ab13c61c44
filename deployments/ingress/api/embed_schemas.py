"""Request and response shapes of the other embedding dialects: Cohere's embed (`/v1/embed`,
`/v2/embed`) and text-embeddings-inference's (`/embed`, `/`, `/info`).

`model` (where the dialect lacks it) and `priority` are documented extensions; any other
unknown field (Cohere's `images`, for one) is a 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictStr

from deployments.ingress.api.rerank_schemas import PriorityField, TruncationDirection
from deployments.ingress.api.schemas import ApiModel, Count, NonEmptyStr

InputType = Literal["search_document", "search_query", "classification", "clustering"]
CohereType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]
Texts = Annotated[list[NonEmptyStr], Field(min_length=1)]

TEXTS_SHAPE = "'texts' must be a non-empty array of non-empty strings"
TEI_INPUTS_SHAPE = "'inputs' must be a non-empty string or a non-empty array of them"


class CohereEmbedRequest(ApiModel):
    """Cohere's embed request, v1 (`/v1/embed`); v2 adds `output_dimension` and base64."""

    texts: Texts = Field(..., description="The texts to embed; at most the model's max_inputs.")
    model: StrictStr | None = Field(
        None, description="An embedding model from GET /v1/models; default the first one."
    )
    input_type: InputType | None = Field(
        None,
        description="Prepends the model's sentence-transformers prompt of this name (or "
        "`query` for search_query, `document` for search_document); a model without such a "
        "prompt embeds the texts as they are.",
    )
    embedding_types: Annotated[list[CohereType], Field(min_length=1)] | None = Field(
        None,
        description="Any of float, int8, uint8, binary, ubinary (base64 on v2 only), "
        "quantised as sentence-transformers' quantize_embeddings does: int8/uint8 over the "
        "range of this request's own vectors (so at least two texts), binary/ubinary as "
        "packed sign bits (binary offset by -128).",
    )
    truncate: Literal["NONE", "START", "END"] | None = Field(
        None,
        description="A text over the model window: NONE answers 400, START/END cut that "
        "end. Default: the model's `truncate` setting (END when true).",
    )
    priority: PriorityField = Field(None, description="Priority class, as X-Priority.")


class CohereEmbedV2Request(CohereEmbedRequest):
    output_dimension: Count | None = Field(
        None, description="Keep the first N components, re-normalised; at most the model's."
    )


class CohereMeta(ApiModel):
    api_version: dict[str, str]
    billed_units: dict[str, int]


class CohereEmbedResponse(ApiModel):
    id: str
    response_type: Literal["embeddings_floats", "embeddings_by_type"]
    embeddings: list[list[float]] | dict[str, list[list[int]] | list[list[float]] | list[str]]
    texts: list[str]
    meta: CohereMeta


class TeiEmbedRequest(ApiModel):
    """text-embeddings-inference's embed request."""

    inputs: NonEmptyStr | Texts = Field(..., description="A text or a list of texts.")
    normalize: StrictBool = Field(True, description="false: the model's own output vectors.")
    truncate: StrictBool | None = Field(
        None,
        description="Cut a text over the model window (false: 400). Default: the model's "
        "`truncate` setting.",
    )
    truncation_direction: TruncationDirection = Field(
        "Right", description="Right cuts the end of a long text, Left its start."
    )
    prompt_name: StrictStr | None = Field(
        None, description="A sentence-transformers prompt of the model, prepended (400 if none)."
    )
    dimensions: Count | None = Field(None, description="Keep the first N components.")
    model: StrictStr | None = Field(
        None, description="Extension: an embedding model; default the first one configured."
    )
    priority: PriorityField = Field(None, description="Priority class, as X-Priority.")


class TeiInfo(ApiModel):
    """What text-embeddings-inference's GET /info tells a client, for the first embedding
    model."""

    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: dict[str, Any]
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    sha: str | None
    docker_label: str | None
