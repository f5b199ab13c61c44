"""Embeddings in the ingress: request -> job, and the response as plain dicts of numpy arrays,
serialised by orjson in one pass."""

from __future__ import annotations

import uuid
from typing import Any, cast

import orjson

from deployments.config import EmbeddingModelConfig
from deployments.core.access.access import estimate_tokens
from deployments.core.encoding.vectors import shrink_dimensions, to_base64
from deployments.core.protocol import EmbedJob, EmbedResult
from deployments.errors import InvalidRequest, PayloadTooLarge
from deployments.ingress.api.schemas import EmbeddingRequest


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


def to_json(body: Any) -> bytes:
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


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
