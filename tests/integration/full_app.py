"""The ingress's real HTTP app with a fake of every kind of model: embedding, rerank and
generation, for tests that cover every route at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx

from deployments.http.server import HttpIngress as Ingress
from tests.integration.conftest import FakeEmbedder
from tests.integration.test_generation_route import MODEL as LLM
from tests.integration.test_generation_route import FakeGenerator
from tests.integration.test_rerank_route import RERANK, FakeReranker, rerank_config

EMBEDDER = "fake-embedder"


@dataclass
class FullApp:
    tenants: list[dict[str, Any]] | None = None
    embedder: FakeEmbedder = field(default_factory=FakeEmbedder)
    reranker: FakeReranker = field(default_factory=FakeReranker)
    generator: FakeGenerator = field(default_factory=FakeGenerator)

    def __post_init__(self) -> None:
        config = rerank_config()
        config["generation_models"] = [{"name": LLM, "source": "demo:tiny-llama"}]
        # The validation tests send token ids at their bounds; they must reach the model.
        config["embedding_models"][0]["accept_token_ids"] = True
        if self.tenants is not None:
            config["auth"] = {"tenants": self.tenants}

        async def ready() -> None:
            return None

        ingress = Ingress(
            config,
            embedders={EMBEDDER: self.embedder},
            readiness=ready,
            rerankers={RERANK: self.reranker},
            generators={LLM: self.generator},
        )
        self.app = ingress.__serve_build_asgi_app__()

    def client(self) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.app, raise_app_exceptions=False)
        return httpx.AsyncClient(transport=transport, base_url="http://ingress")

    def model_calls(self) -> int:
        return len(self.embedder.calls) + len(self.reranker.calls) + len(self.generator.calls)
