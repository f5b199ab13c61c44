"""The ingress's `user_config`: how traffic is split between the versions of each model.

It travels as the ingress deployment's `user_config` (the `deployments:` section of the
app in serve_config.yaml), so `serve deploy` changes it on a running server without
restarting anything (docs/operations.md, "Gray release").
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from deployments.config.allocator import Allocator
from deployments.config.app import EmbeddingModelConfig, GenerationModelConfig, RerankModelConfig
from deployments.config.strict import StrictModel

StickyKey = Literal["session", "user", "api_key"]
STICKY_ORDER: tuple[StickyKey, ...] = ("session", "user", "api_key")


class VersionPlace(StrictModel):
    """A version served by an application of its own (`deployments.app:build_model_app`),
    so it comes and goes without restarting the main application."""

    app: str = Field(..., min_length=1, description="The Serve application that serves it.")


class ShadowPolicy(StrictModel):
    version: str = Field(..., min_length=1, description="The candidate that gets the copies.")
    fraction: float = Field(
        ..., gt=0, le=1, description="Share of the model's requests also sent to it."
    )
    max_in_flight: int = Field(
        8,
        ge=1,
        description="Copies waiting or running at once per ingress replica; beyond it a "
        "copy is dropped (counted), never queued behind the client's own request.",
    )


class GuardPolicy(StrictModel):
    window_s: float = Field(60, gt=0, description="The window the figures are taken over.")
    min_requests: int = Field(
        20, ge=1, description="Answers of the canary and the primary in the window first."
    )
    max_error_rate_increase: float | None = Field(
        0.05, ge=0, le=1, description="Most the canary's error rate may exceed the primary's."
    )
    max_p99_ratio: float | None = Field(
        2.0, gt=0, description="Most the canary's p99 may be, as a multiple of the primary's."
    )
    min_agreement: float | None = Field(
        None, ge=-1, le=1, description="Least mean shadow agreement of the canary."
    )
    rearm: int = Field(
        0,
        description="Change it (e.g. add 1) to restore a tripped canary's weight: a trip "
        "stands until an operator says otherwise.",
    )


class ModelTraffic(StrictModel):
    versions: dict[str, VersionPlace] = Field(
        default_factory=dict,
        description="Versions served by applications of their own; versions in the app's "
        "args need no entry.",
    )
    weights: dict[str, float] = Field(
        default_factory=dict,
        description="Share of new requests per version (any scale; 0 = pinned requests "
        "only). None given: the first version in the args takes everything.",
    )
    sticky_by: list[StickyKey] = Field(
        default_factory=lambda: list(STICKY_ORDER),
        description="What keeps a caller on one version while the weights stand, first "
        "found first: X-Session-ID, the body's `user`, the API key. Empty = drawn anew "
        "for every request.",
    )
    shadow: ShadowPolicy | None = None
    guard: GuardPolicy | None = None

    @model_validator(mode="after")
    def _weights_are_non_negative(self) -> ModelTraffic:
        negative = sorted(v for v, w in self.weights.items() if w < 0)
        if negative:
            raise ValueError(f"weights must be >= 0: {negative}")
        return self


class TrafficConfig(StrictModel):
    models: dict[str, ModelTraffic] = Field(
        default_factory=dict, description="Per model name; a model not named has no split."
    )


class ModelAppConfig(StrictModel):
    """The args of `deployments.app:build_model_app`: one version of one model."""

    embedding_model: EmbeddingModelConfig | None = None
    rerank_model: RerankModelConfig | None = None
    generation_model: GenerationModelConfig | None = None
    allocator: Allocator = Field("jemalloc", description="As the main app's `allocator`.")

    @model_validator(mode="after")
    def _one_model(self) -> ModelAppConfig:
        given = [m for m in (self.embedding_model, self.rerank_model, self.generation_model) if m]
        if len(given) != 1:
            raise ValueError("name exactly one of embedding_model, rerank_model, generation_model")
        return self
