"""The embedding task in the ingress: every dialect (OpenAI's, Cohere's v1 and v2,
text-embeddings-inference's) parsed into one `EmbedCall`: which model, which class, the job
(always an `EmbedJob`, so admission, priorities, deadlines and batching are the same for
all) and how the result is answered in the caller's shape. The schemas are in
`api/schemas.py` and `api/embed_schemas.py`."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import numpy as np
from pydantic import BaseModel, ValidationError

from deployments.config import EmbeddingModelConfig
from deployments.core.access.access import estimate_tokens
from deployments.core.encoding.quantize import Precision, RangeUnknown, quantize
from deployments.core.encoding.vectors import shrink_dimensions, to_base64
from deployments.core.protocol import EmbedJob, EmbedResult
from deployments.errors import InvalidRequest, ModelNotFound, PayloadTooLarge
from deployments.ingress.api.dialects import Dialect
from deployments.ingress.api.embed_schemas import (
    TEI_INPUTS_SHAPE,
    TEXTS_SHAPE,
    CohereEmbedRequest,
    CohereEmbedV2Request,
    TeiEmbedRequest,
)
from deployments.ingress.api.schemas import INPUT_SHAPE, EmbeddingRequest, as_invalid_request
from deployments.ingress.calls.model_client import ModelClient

Truncate = Literal["end", "start", "refuse"]
Schema = TypeVar("Schema", bound=BaseModel)

# Cohere's input types, each with sentence-transformers' own name for the same prompt.
PROMPT_ALIASES = {"search_query": "query", "search_document": "document"}
PRECISIONS: dict[str, Precision] = {
    "float": "float32",
    "int8": "int8",
    "uint8": "uint8",
    "binary": "binary",
    "ubinary": "ubinary",
}


@dataclass(frozen=True)
class EmbedCall:
    model: str | None  # None: the first embedding model (Cohere v1 and TEI may name none)
    priority: str | None
    job: Callable[[EmbeddingModelConfig, str], EmbedJob]  # (model, request id) -> job
    respond: Callable[[EmbedResult, str], Any]  # (result, model name) -> response body
    user: str | None = None  # OpenAI's end-user id: keeps that user on one model version
    # With a `dimensions` (or `output_dimension`): given the model's width, raises the
    # dialect's 400 for one wider than it, before the job is admitted or charged.
    check_width: Callable[[int], None] | None = None


def parse_embed_call(body: bytes, dialect: Dialect) -> EmbedCall:
    if dialect.family == "openai":
        openai = _parse(EmbeddingRequest, body, {"input": INPUT_SHAPE})
        return EmbedCall(
            openai.model,
            openai.priority,
            lambda model, request_id: embedding_job(openai, model, request_id),
            lambda result, _: embedding_response(result, openai),
            openai.user,
            None if openai.dimensions is None else lambda width: check_dimensions(openai, width),
        )
    if dialect.family == "tei":
        tei = _parse(TeiEmbedRequest, body, {"inputs": TEI_INPUTS_SHAPE})
        return EmbedCall(
            tei.model,
            tei.priority,
            lambda m, r: tei_job(tei, m, r),
            tei_answer(tei),
            check_width=_width_check(tei.dimensions, "dimensions"),
        )
    cohere = _parse(dialect.request, body, {"texts": TEXTS_SHAPE})
    assert isinstance(cohere, CohereEmbedRequest)
    if dialect.version == 1 and "base64" in (cohere.embedding_types or ()):
        raise InvalidRequest(
            "'base64' is an embedding type of /v2/embed; /v1/embed has float, int8, uint8, "
            "binary and ubinary.",
            param="embedding_types",
        )
    ranged = [kind for kind in cohere.embedding_types or () if kind in ("int8", "uint8")]
    if ranged and len(cohere.texts) < 2:
        raise _range_unknown(ranged[0])
    check_width = None
    if isinstance(cohere, CohereEmbedV2Request):
        check_width = _width_check(cohere.output_dimension, "output_dimension")
    return EmbedCall(
        cohere.model,
        cohere.priority,
        lambda model, request_id: cohere_job(cohere, model, request_id),
        lambda result, _: cohere_response(result, cohere, version=str(dialect.version)),
        check_width=check_width,
    )


async def refuse_wider_than_model(call: EmbedCall, client: ModelClient | None) -> None:
    """A request for more components than the model's vectors have is refused here, before
    admission: no queue slot, no forward pass, no tokens charged. The width comes from the
    replica (asked once); without it the answer's own check refuses after the pass."""
    if call.check_width is None or client is None:
        return
    width = await client.output_width()
    if width is not None:
        call.check_width(width)


def find_model(models: dict[str, EmbeddingModelConfig], name: str | None) -> EmbeddingModelConfig:
    if name is None and models:
        name = next(iter(models))
    model = models.get(name or "")
    if model is None:
        if name is None:
            raise ModelNotFound("This server has no embedding model.", param="model")
        raise ModelNotFound(
            f"The model '{name}' does not exist; GET /v1/models lists them.", param="model"
        )
    return model


def texts_job(
    texts: list[str], model: EmbeddingModelConfig, request_id: str, param: str, **options: Any
) -> EmbedJob:
    if len(texts) > model.max_inputs:
        raise PayloadTooLarge(
            f"{len(texts)} inputs in one request; model '{model.name}' accepts at most "
            f"{model.max_inputs}.",
            param=param,
        )
    return EmbedJob(texts=texts, job_id=uuid.uuid4().hex, request_id=request_id, **options)


def cohere_job(
    request: CohereEmbedRequest, model: EmbeddingModelConfig, request_id: str
) -> EmbedJob:
    names: tuple[str, ...] = ()
    if request.input_type is not None:
        alias = PROMPT_ALIASES.get(request.input_type)
        names = (request.input_type,) if alias is None else (request.input_type, alias)
    modes: dict[str, Truncate] = {"NONE": "refuse", "START": "start", "END": "end"}
    truncate = None if request.truncate is None else modes[request.truncate]
    return texts_job(
        request.texts,
        model,
        request_id,
        "texts",
        truncate=truncate,
        prompt_names=names,
        prompt_optional=True,
    )


def cohere_response(
    result: EmbedResult, request: CohereEmbedRequest, version: str
) -> dict[str, Any]:
    vectors = result.vectors
    if isinstance(request, CohereEmbedV2Request):
        vectors = _fit_dimensions(vectors, request.output_dimension, "output_dimension")
    body: dict[str, Any] = {"id": uuid.uuid4().hex}
    if version == "1" and request.embedding_types is None:
        body["response_type"] = "embeddings_floats"
        body["embeddings"] = vectors
    else:
        body["response_type"] = "embeddings_by_type"
        types = request.embedding_types or ["float"]
        body["embeddings"] = {kind: _as_type(vectors, kind) for kind in dict.fromkeys(types)}
    body["texts"] = request.texts
    body["meta"] = {
        "api_version": {"version": version},
        "billed_units": {"input_tokens": sum(result.token_counts)},
    }
    return body


def tei_job(request: TeiEmbedRequest, model: EmbeddingModelConfig, request_id: str) -> EmbedJob:
    texts = [request.inputs] if isinstance(request.inputs, str) else request.inputs
    cut = model.truncate if request.truncate is None else request.truncate
    left = request.truncation_direction.lower() == "left"
    truncate: Truncate = ("start" if left else "end") if cut else "refuse"
    names = () if request.prompt_name is None else (request.prompt_name,)
    return texts_job(
        texts,
        model,
        request_id,
        "inputs",
        truncate=truncate,
        prompt_names=names,
        normalize=request.normalize,
    )


def tei_answer(request: TeiEmbedRequest) -> Callable[[EmbedResult, str], Any]:
    def respond(result: EmbedResult, _: str) -> np.ndarray:
        vectors = result.vectors
        if request.normalize:  # the kept components re-normalised, as for OpenAI's
            return _fit_dimensions(vectors, request.dimensions, "dimensions")
        _fit_dimensions(vectors[:1], request.dimensions, "dimensions")
        return vectors[:, : request.dimensions]

    return respond


def _fit_dimensions(vectors: np.ndarray, dimensions: int | None, param: str) -> np.ndarray:
    _check_width(dimensions, vectors.shape[1], param)
    return shrink_dimensions(vectors, dimensions)


def _check_width(dimensions: int | None, width: int, param: str) -> None:
    if dimensions is not None and dimensions > width:
        raise InvalidRequest(f"'{param}' is {dimensions}; the model has {width}.", param=param)


def _width_check(dimensions: int | None, param: str) -> Callable[[int], None] | None:
    if dimensions is None:
        return None
    return lambda width: _check_width(dimensions, width, param)


def _as_type(vectors: np.ndarray, kind: str) -> Any:
    if kind == "base64":
        return [to_base64(vector) for vector in vectors]
    try:
        return quantize(vectors, PRECISIONS[kind])
    except RangeUnknown:
        raise _range_unknown(kind) from None


def _range_unknown(kind: str) -> InvalidRequest:
    return InvalidRequest(
        f"'{kind}' scales each dimension over the range of the request's own vectors "
        "(as sentence-transformers' quantize_embeddings does without calibration), so it "
        "needs at least two texts; send float, binary or ubinary for a single text.",
        param="embedding_types",
    )


def _parse(schema: type[Schema], body: bytes, shapes: dict[str, str]) -> Schema:
    try:
        return schema.model_validate_json(body)
    except ValidationError as exc:
        raise as_invalid_request(exc, shapes) from None


# OpenAI's embeddings: the job from its `input`, and its answer.


def check_dimensions(request: EmbeddingRequest, width: int) -> None:
    """`dimensions` keeps the first N of the model's `width` components: more is a 400."""
    if request.dimensions is not None and request.dimensions > width:
        raise InvalidRequest(
            f"'dimensions' is {request.dimensions}; model '{request.model}' has {width}.",
            param="dimensions",
        )


def embedding_response(result: EmbedResult, request: EmbeddingRequest) -> dict[str, Any]:
    check_dimensions(request, result.vectors.shape[1])
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


def embedding_job(
    request: EmbeddingRequest, model: EmbeddingModelConfig, request_id: str
) -> EmbedJob:
    value = request.input
    job_id = uuid.uuid4().hex
    # The schema's union is checked; an isinstance on the first item tells which member.
    if isinstance(value, str):
        job = EmbedJob(texts=[value], job_id=job_id, request_id=request_id)
    elif not value:
        raise InvalidRequest("'input' must not be an empty array.", param="input")
    elif isinstance(value[0], str):
        texts = cast(list[str], value)
        job = EmbedJob(texts=texts, job_id=job_id, request_id=request_id)
    elif isinstance(value[0], int):
        one = cast(list[int], value)
        job = EmbedJob(token_ids=[one], job_id=job_id, request_id=request_id)
    else:
        many = cast(list[list[int]], value)
        job = EmbedJob(token_ids=many, job_id=job_id, request_id=request_id)
    if job.token_ids is not None and not model.accept_token_ids:
        raise token_ids_not_accepted(model.name)
    inputs = job.texts if job.texts is not None else job.token_ids
    assert inputs is not None
    if any(len(item) == 0 for item in inputs):
        raise InvalidRequest("'input' must not contain empty strings or arrays.", param="input")
    if len(inputs) > model.max_inputs:
        raise PayloadTooLarge(
            f"{len(inputs)} inputs in one request; model '{model.name}' accepts at most "
            f"{model.max_inputs}.",
            param="input",
        )
    return job


def token_ids_not_accepted(model: str) -> InvalidRequest:
    """The 400 for token ids a model was not configured to trust: ids from another
    tokenizer (tiktoken's, sent by OpenAI clients) would be read as this model's own and
    give a wrong vector with a 200, so they are refused unless the config says otherwise."""
    return InvalidRequest(
        f"Model '{model}' does not accept token ids as 'input': ids from another tokenizer "
        "(OpenAI clients send tiktoken's) would be misread as this model's own. Send the "
        "text instead; with LangChain's OpenAIEmbeddings, set "
        "check_embedding_ctx_length=False. (An operator can set accept_token_ids: true on "
        "a model whose clients send ids in its own vocabulary.)",
        param="input",
        code="token_ids_not_accepted",
    )


def embedding_token_estimate(job: EmbedJob) -> int:
    if job.texts is not None:
        return estimate_tokens(job.texts)
    return sum(len(ids) + 2 for ids in job.token_ids or ())
