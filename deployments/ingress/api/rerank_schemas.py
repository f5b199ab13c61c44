"""Request and response shapes of the rerank routes: Cohere/Jina (`/v1/rerank`,
`/v2/rerank`) and TEI (`/rerank`), parsed into one `RerankQuery`.

Fields beyond a dialect's own are documented extensions (`raw_scores` for Cohere/Jina,
`model` for TEI, `priority` for both); any other unknown field is a 400 naming it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, StrictStr

from deployments.ingress.api.schemas import ApiModel, Count, NonEmptyStr

PriorityField = Literal["realtime", "normal", "batch"] | None
# TEI writes them capitalised; huggingface_hub sends them lower-case.
TruncationDirection = Literal["Left", "Right", "left", "right"]

# An empty document is legal: it is one candidate among others and ranks by its score
# (search results do contain empty passages); only an empty list is refused.
DOCUMENTS_SHAPE = (
    "'documents' must be a non-empty array of strings or of {\"text\": string} objects"
)
TEXTS_SHAPE = "'texts' must be a non-empty array of strings"


class TextDocument(ApiModel):
    text: StrictStr


class RerankRequest(ApiModel):
    """Cohere's (v1, v2) and Jina's rerank request."""

    model: StrictStr = Field(..., description="A rerank model name from GET /v1/models.")
    query: NonEmptyStr = Field(..., description="The search query; not blank.")
    documents: list[StrictStr | TextDocument] = Field(
        ...,
        min_length=1,
        description='The documents to rank: strings or {"text": ...} objects. At most the '
        "model's `max_documents` (413).",
    )
    top_n: Count | None = Field(
        None, description="Return only the N best documents (all when N exceeds them)."
    )
    return_documents: StrictBool | None = Field(
        None,
        description="Include each document's text in its result. Default: true on "
        "/v1/rerank (Jina's default), false on /v2/rerank (Cohere's).",
    )
    max_tokens_per_doc: Count | None = Field(
        None,
        description="Score at most this many tokens of each document; can only lower the "
        "model's own limit.",
    )
    raw_scores: StrictBool = Field(
        False,
        description="Extension: the model's raw scores (cross-encoder logits, bi-encoder "
        "cosines) instead of relevance in [0, 1].",
    )
    priority: PriorityField = Field(None, description="Priority class, as X-Priority.")


class TeiRerankRequest(ApiModel):
    """Hugging Face text-embeddings-inference's rerank request."""

    query: NonEmptyStr = Field(..., description="The search query; not blank.")
    texts: list[StrictStr] = Field(
        ..., min_length=1, description="The texts to rank; at most the model's `max_documents`."
    )
    raw_scores: StrictBool = Field(False, description="Raw model scores, not [0, 1].")
    return_text: StrictBool = Field(False, description="Include each text in its result.")
    truncate: StrictBool | None = Field(
        None,
        description="true: score only each text's first window, as TEI does; false or "
        "absent: score a long text chunk by chunk (TEI would refuse it).",
    )
    truncation_direction: TruncationDirection = Field(
        "Right",
        description="Which end `truncate` cuts: Right (keep the start) only; Left with "
        "truncate true is a 400. Without truncate no text is cut, so either is accepted.",
    )
    model: StrictStr | None = Field(
        None, description="Extension: a rerank model name; default the first one configured."
    )
    priority: PriorityField = Field(None, description="Priority class, as X-Priority.")


class RerankResultEntry(ApiModel):
    index: int
    relevance_score: float
    document: TextDocument | None = None


class RerankUsage(ApiModel):
    total_tokens: int
    truncated_documents: int = Field(0, description="Documents cut at max_tokens_per_doc.")


class RerankResponse(ApiModel):
    id: str
    model: str
    results: list[RerankResultEntry]
    usage: RerankUsage
    meta: dict = Field(description="Cohere's meta: billed_units and tokens.")


class TeiRank(ApiModel):
    index: int
    score: float
    text: str | None = None
