"""A generation model's config: its engine, KV cache and sequence limits, and the queue it
keeps per priority class (`config/app.py` holds the whole application's)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from deployments.config.base import ModelDeploymentConfig
from deployments.config.output_neutral import OutputNeutral
from deployments.config.strict import StrictModel
from deployments.core.priority import PriorityName

_MAX_QUEUED: dict[PriorityName, int] = {"realtime": 64, "normal": 256, "batch": 1024}
_AGED_AFTER_S: dict[PriorityName, float | None] = {"realtime": None, "normal": 2.0, "batch": 5.0}


class GenerationQueue(StrictModel):
    """How a generation replica admits sequences into its engine, per priority class. Sent
    as the deployment's `user_config`, so it changes at runtime without a restart."""

    max_queued: dict[PriorityName, int] = Field(
        default_factory=lambda: dict(_MAX_QUEUED),
        description="Requests of a class waiting for a slot, at most (then 429, or 503 "
        "for realtime).",
    )
    aged_after_s: dict[PriorityName, float | None] = Field(
        default_factory=lambda: dict(_AGED_AFTER_S),
        description="A waiting request of this class that has waited this long goes "
        "ahead of higher classes; None = strict priority.",
    )


class GenerationModelConfig(ModelDeploymentConfig):
    source: str = Field(
        ...,
        min_length=1,
        description="A local directory holding a Hugging Face causal-LM checkpoint "
        "(`save_pretrained`), `package:<module>`, or `demo:tiny-llama`: a small model "
        "with random weights built on first use (meaningless text).",
    )
    cache_dir: OutputNeutral[str | None] = Field(
        None, description="Where demo models are built; default ~/.cache/tributary."
    )
    engine: Literal["continuous", "static"] = Field(
        "continuous",
        description="continuous: transformers' continuous-batching manager (sequences "
        "join and leave at every step); static: @serve.batch over batched `generate` "
        "(kept for comparison).",
    )
    max_num_seqs: OutputNeutral[int | None] = Field(
        32,
        ge=1,
        description="Sequences in flight per replica; null = kv_cache_tokens divided by "
        "twice default_max_tokens (a prompt about as long as its answer).",
    )
    kv_cache_tokens: OutputNeutral[int | None] = Field(
        16384,
        ge=64,
        description="KV cache size in tokens; also the budget of prompt + max_tokens "
        "summed over the sequences in flight. null = derived at start from memory: "
        "kv_cache_memory_fraction of the GPU's free memory, or kv_cache_memory_mib on a CPU.",
    )
    kv_cache_memory_fraction: OutputNeutral[float] = Field(
        0.5,
        gt=0,
        le=0.95,
        description="On a GPU with kv_cache_tokens null: the share of the device's free "
        "memory, measured after the model loaded, that the KV cache may take.",
    )
    kv_cache_memory_mib: OutputNeutral[int] = Field(
        512,
        ge=1,
        description="On a CPU with kv_cache_tokens null: the KV cache's memory budget.",
    )
    max_batch_tokens: int = Field(
        256, ge=16, description="Tokens (prefill + decode) in one continuous-batching step."
    )
    page_size: OutputNeutral[int] = Field(32, ge=4, description="Tokens per KV cache page.")
    scheduler: Literal["fifo", "prefill_first"] = "fifo"
    static_batch_wait_s: OutputNeutral[float] = Field(
        0.01, ge=0, description="static engine: how long a partial batch waits for more."
    )
    default_max_tokens: OutputNeutral[int] = Field(
        128, ge=1, description="When a request sends none."
    )
    max_tokens_limit: OutputNeutral[int] = Field(
        512, ge=1, description="Largest `max_tokens` (400 above)."
    )
    max_stop_sequences: OutputNeutral[int] = Field(4, ge=0)
    queue: OutputNeutral[GenerationQueue] = GenerationQueue()
    standby_replicas: OutputNeutral[int] = Field(
        0,
        ge=0,
        description="Replicas started beside `deployment.num_replicas` that take no calls "
        "while those serve: when one dies, calls go to a standby at once instead of "
        "waiting for Serve to start a replacement (imports and weights: ~8-14 s for the "
        "demo model on 2 cores). Each holds its own weights and KV cache.",
    )

    @model_validator(mode="after")
    def _standby_needs_a_fixed_count(self) -> GenerationModelConfig:
        if self.standby_replicas and self.deployment.autoscaling_config is not None:
            raise ValueError("standby_replicas needs a fixed deployment.num_replicas")
        return self
