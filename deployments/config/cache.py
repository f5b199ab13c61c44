"""The `cache:` section of the app args: the per-item result cache at the ingress, and
optionally whole greedy completions (README, "Result cache"; docs/operations.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from deployments.config.strict import StrictModel


class CacheConfig(StrictModel):
    enabled: bool = Field(
        False,
        description="Look every embedding input and rerank query-document pair up before it "
        "reaches a model; compute only the misses, each once.",
    )
    models: list[str] | None = Field(
        None,
        description="The models that use the cache; None = every embedding and rerank "
        "model, and every generation model when `generation` is on.",
    )
    generation: bool = Field(
        False,
        description="Also cache completions (/v1/completions, /v1/chat/completions, "
        "streamed or not) of the generation models, greedy requests only (temperature 0): "
        "one entry per prompt or message list, max_tokens and stop sequences; a sampled "
        "request is never looked up nor stored. Needs `enabled`.",
    )
    max_bytes: int = Field(
        256 * 1024 * 1024,
        ge=4096,
        description="memory backend: bytes of entries kept per model and ingress replica; "
        "the least recently used go first (a 384-dim vector is ~1.8 KB with its key).",
    )
    ttl_s: float | None = Field(
        None,
        gt=0,
        description="Seconds an entry lives; None = until evicted. Entries never go stale "
        "(a new model version has its own keys), so a TTL only bounds how long a text "
        "is remembered.",
    )
    scope: Literal["global", "tenant"] = Field(
        "global",
        description="global: one entry serves every caller; tenant: entries per tenant "
        "(API key's tenant name), so no tenant can time whether another sent a text.",
    )
    backend: Literal["memory", "redis"] = Field(
        "memory",
        description="memory: in each ingress replica; redis: one shared server for every "
        "ingress replica and node (binary values, batched reads and writes).",
    )
    url: str | None = Field(None, description="redis: redis://host:port/db")
    timeout_s: float = Field(
        0.05,
        gt=0,
        description="redis: the longest a lookup or a write may take; slower counts as an "
        "error and the request goes on without the cache.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> CacheConfig:
        if self.backend == "redis" and not self.url:
            raise ValueError("cache: backend redis needs url (redis://host:port)")
        if self.generation and not self.enabled:
            raise ValueError("cache: generation: true needs enabled: true")
        return self
