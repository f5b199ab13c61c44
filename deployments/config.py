"""Typed application arguments: everything under `args:` in serve_config.yaml.

`build_app` validates the raw dict with `AppConfig.model_validate`, so a bad config fails
at build time with pydantic's message, which names the offending field path.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StrictModel(BaseModel):
    # Unknown keys are typos in a config file; reject them instead of ignoring them.
    model_config = ConfigDict(extra="forbid", frozen=True)


class ActorOptions(StrictModel):
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    memory: int | None = Field(None, gt=0, description="Bytes of RAM to reserve.")
    runtime_env: dict[str, Any] | None = Field(
        None, description="Ray runtime_env of the replicas, e.g. {env_vars: {...}}."
    )

    def to_ray(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class AutoscalingOptions(StrictModel):
    """Serve's `autoscaling_config`; replaces a fixed `num_replicas`."""

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(1, ge=1)
    initial_replicas: int | None = Field(None, ge=0)
    target_ongoing_requests: float = Field(2.0, gt=0)
    upscale_delay_s: float = Field(30.0, ge=0)
    downscale_delay_s: float = Field(600.0, ge=0)
    metrics_interval_s: float | None = Field(None, gt=0)
    look_back_period_s: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _bounds_are_ordered(self) -> AutoscalingOptions:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must not exceed max_replicas")
        return self


class DeploymentOptions(StrictModel):
    """The Ray Serve deployment settings of one deployment."""

    num_replicas: int | None = Field(
        None, ge=1, description="Fixed replica count (1 when neither this nor autoscaling)."
    )
    autoscaling_config: AutoscalingOptions | None = None
    max_ongoing_requests: int = Field(64, ge=1)
    max_queued_requests: int = Field(
        256, ge=-1, description="Serve's per-caller queue bound; -1 means unbounded."
    )
    ray_actor_options: ActorOptions = ActorOptions()

    @model_validator(mode="after")
    def _one_way_to_size(self) -> DeploymentOptions:
        if self.num_replicas is not None and self.autoscaling_config is not None:
            raise ValueError("set num_replicas or autoscaling_config, not both")
        return self

    def to_serve(self) -> dict[str, Any]:
        options = self.model_dump(exclude={"ray_actor_options", "autoscaling_config"})
        if self.autoscaling_config is not None:
            options.pop("num_replicas")
            options["autoscaling_config"] = self.autoscaling_config.model_dump(exclude_none=True)
        elif self.num_replicas is None:
            options["num_replicas"] = 1
        options["ray_actor_options"] = self.ray_actor_options.to_ray()
        return options


class BatchSettings(StrictModel):
    """Batch knobs of a model deployment; sent as its `user_config`, so they can change
    at runtime with `serve deploy` and no restart."""

    max_batch_size: int = Field(32, ge=1, description="Most items in one forward pass.")
    batch_wait_timeout_s: float = Field(
        0.01, ge=0, description="How long a partial batch waits for more items."
    )
    max_batch_tokens: int = Field(
        8192,
        ge=1,
        description="Most padded tokens (items x longest item) in one forward pass.",
    )


class EmbeddingModelConfig(StrictModel):
    name: str = Field(..., min_length=1, description="The `model` name clients send.")
    source: str = Field(
        ...,
        min_length=1,
        description="`package:<module>` (weights shipped in a Python package) or a "
        "local directory saved by sentence-transformers.",
    )
    truncate: bool = Field(
        True,
        description="Cut texts longer than the model window (and say so in the "
        "response); false answers 400 instead.",
    )
    max_inputs: int = Field(2048, ge=1, description="Most inputs in one request (413).")
    torch_threads: int = Field(
        0, ge=0, description="Intra-op threads for the forward pass; 0 = the actor's num_cpus."
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="Weights' precision; auto = float16 on a GPU Ray assigned, float32 on CPU.",
    )
    batching: BatchSettings = BatchSettings()
    deployment: DeploymentOptions = DeploymentOptions()


class IngressConfig(StrictModel):
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Largest request body accepted (413)."
    )
    max_in_flight_per_model: int = Field(
        2,
        ge=1,
        description="Concurrent calls from one ingress replica to one model deployment; "
        "requests arriving while all are busy are coalesced into the next call.",
    )
    max_group_items: int = Field(
        256,
        ge=1,
        description="Most inputs in one call from the ingress to a model (a larger "
        "request still goes, alone).",
    )
    max_pending_items: int = Field(
        4096,
        ge=1,
        description="Items waiting in one ingress replica for a model; beyond it, 503.",
    )
    deployment: DeploymentOptions = DeploymentOptions(
        max_ongoing_requests=512,
        max_queued_requests=1024,
        ray_actor_options=ActorOptions(num_cpus=0.5),
    )


class AppConfig(StrictModel):
    ingress: IngressConfig = IngressConfig()
    embedding_models: list[EmbeddingModelConfig] = Field(..., min_length=1)

    @model_validator(mode="after")
    def _names_are_unique(self) -> AppConfig:
        names = [m.name for m in self.embedding_models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"embedding_models: duplicate model name(s) {duplicates}")
        return self
