"""The other embedding dialects: Cohere's /v1/embed and /v2/embed, text-embeddings-inference's
/embed, its root route POST / (an embedding model's /embed) and GET /info. The dialect only
changes parsing and the answer's shape (ingress/tasks/embed.py); the job, its admission
and batching are those of /v1/embeddings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from starlette.responses import Response

from deployments.config import ModelBatching
from deployments.http.common import ingress_of, install_model_route, json_response
from deployments.http.openapi import error_responses
from deployments.ingress.api.dialects import COHERE_EMBED_V1, COHERE_EMBED_V2, TEI_EMBED, Dialect
from deployments.ingress.api.embed_schemas import (
    CohereEmbedRequest,
    CohereEmbedResponse,
    CohereEmbedV2Request,
    TeiEmbedRequest,
    TeiInfo,
)
from deployments.ingress.api.schemas import ErrorBody

if TYPE_CHECKING:
    from deployments.config import EmbeddingModelConfig
    from deployments.ingress.ingress import Ingress

EMBED_DIALECT_REQUESTS = (CohereEmbedRequest, CohereEmbedV2Request, TeiEmbedRequest)
VERSION = "0.1.0"


def install_embed_dialect_routes(app: FastAPI, ingress: Ingress) -> None:
    routes: tuple[tuple[str, str, Dialect, Any], ...] = (
        ("/v1/embed", "embed_cohere_v1", COHERE_EMBED_V1, CohereEmbedResponse),
        ("/v2/embed", "embed_cohere_v2", COHERE_EMBED_V2, CohereEmbedResponse),
        ("/embed", "embed_tei", TEI_EMBED, list[list[float]]),
        ("/", "embed_tei_root", TEI_EMBED, list[list[float]]),
    )
    too_large = error_responses({413: too_many_inputs(ingress, "texts")})
    for path, name, dialect, answer in routes:
        install_model_route(
            app, ingress, path, dialect, {200: {"model": answer}, **too_large}, name
        )

    async def info(request: Request) -> Response:
        model, replica = await ingress_of(request).embedding_model_info()
        return json_response(tei_info(model, replica))

    app.get(
        "/info",
        responses={
            200: {"model": TeiInfo},
            404: {"model": ErrorBody, "description": "This server has no embedding model."},
        },
    )(info)


def tei_info(model: EmbeddingModelConfig, replica: dict[str, Any]) -> dict[str, Any]:
    """TEI's /info for the first embedding model, from its config and its replica's info()."""
    runtime = str(replica.get("runtime", ""))
    dtype = "float16" if "fp16" in runtime else "bfloat16" if "bf16" in runtime else "float32"
    batching = live_batching(model, replica).normal
    return {
        "model_id": model.name,
        "model_sha": None,
        "model_dtype": dtype,
        "model_type": {"embedding": {"pooling": replica.get("pooling", "unknown")}},
        "max_concurrent_requests": model.deployment.max_ongoing_requests,
        "max_input_length": int(replica.get("max_tokens", 0)),
        "max_batch_tokens": batching.max_batch_tokens,
        "max_batch_requests": batching.max_batch_size,
        "max_client_batch_size": model.max_inputs,
        "auto_truncate": model.truncate,
        "tokenization_workers": 1,
        "version": f"tributary-{VERSION}",
        "sha": None,
        "docker_label": None,
    }


def live_batching(model: EmbeddingModelConfig, replica: dict[str, Any]) -> ModelBatching:
    """The model's batch knobs as its replica holds them (its `user_config`, changed in place
    by `serve deploy`): the ingress's own copy of the config has none (`ingress_args` in
    deployments/app.py), so its `batching` is the defaults. Only a replica that reports
    none leaves the config's."""
    reported = replica.get("batching")
    return model.batching if reported is None else ModelBatching.model_validate(reported)


def too_many_inputs(ingress: Ingress, what: str) -> str:
    config = ingress.config
    max_inputs = ", ".join(f"{m.name}: {m.max_inputs}" for m in config.embedding_models)
    return (
        f"The body is over {config.ingress.max_body_bytes} bytes, or it has more {what} "
        f"than the model's max_inputs ({max_inputs or 'no embedding model'})."
    )
