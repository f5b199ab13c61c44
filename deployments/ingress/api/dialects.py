"""Every wire format the ingress speaks, as one kind of value.

A route names its `Dialect`; the task's parser reads the body by it and the answer is
shaped by it. Nothing else tells the pipeline which API a client speaks: not the path, not
a flag. The Batch API names the same values for the endpoints a batch may use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from deployments.ingress.api.embed_schemas import (
    CohereEmbedRequest,
    CohereEmbedV2Request,
    TeiEmbedRequest,
)
from deployments.ingress.api.generation_schemas import ChatCompletionRequest, CompletionRequest
from deployments.ingress.api.rerank_schemas import RerankRequest, TeiRerankRequest
from deployments.ingress.api.schemas import EmbeddingRequest

Task = Literal["embedding", "rerank", "generation"]
# Whose API: the shapes of its answers follow that project's documentation.
Family = Literal["openai", "cohere", "jina", "tei"]


@dataclass(frozen=True)
class Dialect:
    name: str  # as the logs and the route names say it
    task: Task
    family: Family
    request: type[BaseModel]  # the body's schema: what parsing checks, what OpenAPI shows
    version: int = 1  # the family's API version (Cohere has two)


OPENAI_EMBEDDINGS = Dialect("openai-embeddings", "embedding", "openai", EmbeddingRequest)
COHERE_EMBED_V1 = Dialect("cohere-embed-v1", "embedding", "cohere", CohereEmbedRequest)
COHERE_EMBED_V2 = Dialect("cohere-embed-v2", "embedding", "cohere", CohereEmbedV2Request, 2)
TEI_EMBED = Dialect("tei-embed", "embedding", "tei", TeiEmbedRequest)
COHERE_RERANK = Dialect("cohere-rerank", "rerank", "cohere", RerankRequest)
JINA_RERANK = Dialect("jina-rerank", "rerank", "jina", RerankRequest, 2)
TEI_RERANK = Dialect("tei-rerank", "rerank", "tei", TeiRerankRequest)
OPENAI_CHAT = Dialect("openai-chat", "generation", "openai", ChatCompletionRequest)
OPENAI_COMPLETIONS = Dialect("openai-completions", "generation", "openai", CompletionRequest)
