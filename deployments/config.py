"""Typed application arguments: everything under `args:` in serve_config.yaml.

`build_app` validates the raw dict with `AppConfig.model_validate`, so a bad config fails
at build time with pydantic's message, which names the offending field path.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from deployments.core.priority import PriorityName
from deployments.serve_options import ActorOptions, DeploymentOptions, StrictModel


class BatchSettings(StrictModel):
    """How one priority class forms batches in a model deployment."""

    max_batch_size: int = Field(32, ge=1, description="Most items in one forward pass.")
    batch_wait_timeout_s: float = Field(
        0.01, ge=0, description="How long a partial batch waits for more items."
    )
    max_batch_tokens: int = Field(
        8192,
        ge=1,
        description="Most padded tokens (items x longest item) in one forward pass.",
    )
    aged_after_s: float | None = Field(
        None,
        gt=0,
        description="A batch of this class that has waited this long at the priority gate "
        "runs next, ahead of higher classes (bounded wait); None = strict priority.",
    )
    target_p99_ms: float | None = Field(
        None,
        gt=0,
        description="A latency target for this class at the model (queue wait + forward "
        "passes). With `adaptive`, every class's passes are kept short enough for it; the "
        "sizes above become ceilings (docs/operations.md, 'Latency targets').",
    )


class ModelBatching(StrictModel):
    """Batch knobs of a model deployment, one set per priority class. Sent as the
    deployment's `user_config`, so they change at runtime with `serve deploy`, no restart."""

    realtime: BatchSettings = BatchSettings(
        max_batch_size=8, batch_wait_timeout_s=0.002, max_batch_tokens=1024
    )
    normal: BatchSettings = BatchSettings(
        max_batch_size=32, batch_wait_timeout_s=0.01, max_batch_tokens=8192, aged_after_s=0.5
    )
    batch: BatchSettings = BatchSettings(
        max_batch_size=64, batch_wait_timeout_s=0.05, max_batch_tokens=16384, aged_after_s=1.0
    )

    adaptive: bool = Field(
        True,
        description="Choose each batch's token budget and wait from the measured cost model, "
        "the targets and the arrival rate, under the numbers above; False = the numbers as "
        "they are, always.",
    )

    def of(self, priority: PriorityName) -> BatchSettings:
        return getattr(self, priority)


class ModelDeploymentConfig(StrictModel):
    """What every model deployment has, whatever its task."""

    name: str = Field(..., min_length=1, description="The `model` name clients send.")
    version: str = Field(
        "1",
        min_length=1,
        description="Which weights or settings serve this name; a label on the request "
        "metrics, so a new version can be told from the old one on a dashboard.",
    )
    torch_threads: int = Field(
        0, ge=0, description="Intra-op threads for the forward pass; 0 = the actor's num_cpus."
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="Weights' precision; auto = float16 on a GPU Ray assigned, float32 on CPU.",
    )
    batching: ModelBatching = ModelBatching()
    deployment: DeploymentOptions = DeploymentOptions()


Runtime = Literal[
    "torch",
    "auto",
    "torch-fp32",
    "torch-bf16",
    "torch-fp16",
    "openvino",
    "openvino-bf16",
    "onnx",
    "onnx-int8",
]


class EncoderModelConfig(ModelDeploymentConfig):
    """An embedding or rerank model: which backend runs its forward pass (docs/backends.md)."""

    runtime: Runtime = Field(
        "torch",
        description="torch: torch in `dtype`; auto: measured at warm-up, the fastest "
        "candidate the hardware has whose output agrees with fp32 (runtime_min_agreement); "
        "or one named: torch-fp32/-bf16/-fp16 (fp16 on a GPU only), openvino (f32), "
        "openvino-bf16, onnx (ONNX Runtime fp32), onnx-int8 (opt-in, less exact).",
    )
    runtime_min_agreement: float = Field(
        0.999,
        gt=0,
        le=1,
        description="auto: least agreement with torch fp32 a candidate needs: the worst "
        "vector's cosine (embeddings, bi-encoder), the scores' correlation (cross-encoder).",
    )
    cache_dir: str | None = Field(
        None, description="Where exported graphs are built; default ~/.cache/tributary."
    )
    gpu_memory_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="On a GPU: the most of the card's memory this replica's process may "
        "take (torch's per-process fraction); a pass beyond it runs out of memory and is "
        "split and retried. None = no fence.",
    )
    memory_limit_mib: int | None = Field(
        None,
        ge=1,
        description="On a Linux CPU: the address space the replica may add after warm-up; a "
        "pass beyond it fails in the allocator and is split and retried instead of the "
        "kernel ending the replica. None = no limit.",
    )

    @model_validator(mode="after")
    def _fp16_needs_a_gpu(self) -> EncoderModelConfig:
        if self.runtime == "torch-fp16" and self.deployment.ray_actor_options.num_gpus <= 0:
            raise ValueError(
                "runtime: torch-fp16 runs on a GPU only; set "
                "deployment.ray_actor_options.num_gpus > 0 or choose another runtime"
            )
        return self


class EmbeddingModelConfig(EncoderModelConfig):
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
    accept_token_ids: bool = Field(
        False,
        description="Accept `input` as token ids. Only for clients that send ids in this "
        "model's own vocabulary: OpenAI clients that tokenize first (LangChain's "
        "OpenAIEmbeddings by default) send tiktoken ids, which this model would misread "
        "as its own and embed into a wrong vector. False answers such input with 400 "
        "`token_ids_not_accepted`, asking for text instead.",
    )


class RerankModelConfig(EncoderModelConfig):
    source: str = Field(
        ...,
        min_length=1,
        description="`package:<module>` or a local directory, as for embedding models.",
    )
    backend: Literal["cross-encoder", "bi-encoder"] = Field(
        ...,
        description="cross-encoder: a sentence-transformers CrossEncoder checkpoint (one "
        "logit per pair); bi-encoder: an embedding model, scoring by cosine.",
    )
    max_documents: int = Field(1000, ge=1, description="Most documents in one request (413).")
    max_tokens_per_doc: int = Field(
        8192,
        ge=1,
        description="Tokens of a document that are scored, at most; a request's "
        "`max_tokens_per_doc` may lower it.",
    )
    chunk_overlap_tokens: int = Field(
        32, ge=0, description="Tokens shared by neighbouring chunks of a long document."
    )
    doc_score: Literal["max", "mean", "first"] = Field(
        "max", description="A chunked document's score from its chunks' scores."
    )
    max_chunk_passes: int = Field(
        1024,
        ge=1,
        description="Most query-chunk pairs (forward passes of one window) one request may "
        "make the model score (413): what bounds a request's cost, since one long document "
        "is many chunks. The ingress estimates it (~4 characters a token) and admits by it; "
        "the replica counts with the tokenizer and refuses the same way.",
    )
    window_tokens: int = Field(
        512,
        ge=8,
        description="The model's window (special tokens included) as the ingress assumes it "
        "when estimating chunk passes, which it does without loading the model; the "
        "replica logs a warning when the real window differs.",
    )


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
    cache_dir: str | None = Field(
        None, description="Where demo models are built; default ~/.cache/tributary."
    )
    engine: Literal["continuous", "static"] = Field(
        "continuous",
        description="continuous: transformers' continuous-batching manager (sequences "
        "join and leave at every step); static: @serve.batch over batched `generate` "
        "(kept for comparison).",
    )
    max_num_seqs: int | None = Field(
        32,
        ge=1,
        description="Sequences in flight per replica; null = kv_cache_tokens divided by "
        "twice default_max_tokens (a prompt about as long as its answer).",
    )
    kv_cache_tokens: int | None = Field(
        16384,
        ge=64,
        description="KV cache size in tokens; also the budget of prompt + max_tokens "
        "summed over the sequences in flight. null = derived at start from memory: "
        "kv_cache_memory_fraction of the GPU's free memory, or kv_cache_memory_mib on a CPU.",
    )
    kv_cache_memory_fraction: float = Field(
        0.5,
        gt=0,
        le=0.95,
        description="On a GPU with kv_cache_tokens null: the share of the device's free "
        "memory, measured after the model loaded, that the KV cache may take.",
    )
    kv_cache_memory_mib: int = Field(
        512,
        ge=1,
        description="On a CPU with kv_cache_tokens null: the KV cache's memory budget.",
    )
    max_batch_tokens: int = Field(
        256, ge=16, description="Tokens (prefill + decode) in one continuous-batching step."
    )
    page_size: int = Field(32, ge=4, description="Tokens per KV cache page.")
    scheduler: Literal["fifo", "prefill_first"] = "fifo"
    static_batch_wait_s: float = Field(
        0.01, ge=0, description="static engine: how long a partial batch waits for more."
    )
    default_max_tokens: int = Field(128, ge=1, description="When a request sends none.")
    max_tokens_limit: int = Field(512, ge=1, description="Largest `max_tokens` (400 above).")
    max_stop_sequences: int = Field(4, ge=0)
    queue: GenerationQueue = GenerationQueue()


class ClassAdmission(StrictModel):
    """How the ingress admits one priority class, per model."""

    max_in_flight: int = Field(
        2,
        ge=1,
        description="Concurrent calls from one ingress replica to the model for this class; "
        "requests arriving while all are busy are coalesced into the next call.",
    )
    max_queued_items: int = Field(
        ..., ge=1, description="Inputs of this class waiting in one ingress replica."
    )
    shed_above_queued_items: int | None = Field(
        None,
        ge=1,
        description="Refuse this class (429) while more inputs than this wait for the model, "
        "all classes counted; lower for batch than for normal, so batch is shed first.",
    )
    timeout_s: float = Field(
        ..., gt=0, description="Deadline when the request sends no X-Request-Timeout."
    )


class AdmissionConfig(StrictModel):
    realtime: ClassAdmission = ClassAdmission(max_queued_items=512, timeout_s=10)
    normal: ClassAdmission = ClassAdmission(
        max_queued_items=4096, shed_above_queued_items=3072, timeout_s=60
    )
    batch: ClassAdmission = ClassAdmission(
        max_queued_items=1024, shed_above_queued_items=1024, timeout_s=600
    )
    max_timeout_s: float = Field(
        3600, gt=0, description="Largest X-Request-Timeout accepted (400 above it)."
    )

    def of(self, priority: PriorityName) -> ClassAdmission:
        return getattr(self, priority)

    @model_validator(mode="after")
    def _realtime_is_never_shed(self) -> AdmissionConfig:
        if self.realtime.shed_above_queued_items is not None:
            raise ValueError("realtime is never shed: drop realtime.shed_above_queued_items")
        return self


class IngressConfig(StrictModel):
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Largest request body accepted (413)."
    )
    max_group_items: int = Field(
        256,
        ge=1,
        description="Most inputs in one call from the ingress to a model (a larger "
        "request still goes, alone).",
    )
    admission: AdmissionConfig = AdmissionConfig()
    deployment: DeploymentOptions = DeploymentOptions(
        max_ongoing_requests=512,
        max_queued_requests=1024,
        ray_actor_options=ActorOptions(num_cpus=0.5),
    )


class TenantConfig(StrictModel):
    name: str = Field(..., min_length=1)
    tier: PriorityName = Field(
        "normal", description="Highest priority class this tenant gets; above it, the cap."
    )
    models: list[str] | None = Field(None, description="Models it may use; None = all.")
    key_sha256: list[str] = Field(
        default_factory=list,
        description="SHA-256 hex digests of its keys (`python -m deployments.keys new`).",
    )
    key_env: str | None = Field(
        None,
        description="Environment variable of the Ray processes holding its key(s), "
        "comma-separated, in clear.",
    )
    key_file: str | None = Field(
        None, description="File with one key per line, in clear or as `sha256:<digest>`."
    )
    requests_per_s: float | None = Field(None, gt=0)
    burst_requests: float | None = Field(None, gt=0, description="Default: 2 s of rate.")
    tokens_per_s: float | None = Field(None, gt=0, description="Input tokens per second.")
    burst_tokens: float | None = Field(None, gt=0, description="Default: 2 s of rate.")

    @model_validator(mode="after")
    def _has_a_key_source(self) -> TenantConfig:
        if not (self.key_sha256 or self.key_env or self.key_file):
            raise ValueError(f"tenant {self.name!r} has no key_sha256, key_env or key_file")
        bad = [d for d in self.key_sha256 if len(d) != 64 or not _is_hex(d)]
        if bad:
            raise ValueError(f"tenant {self.name!r}: not SHA-256 hex digests: {bad}")
        return self


class AuthConfig(StrictModel):
    tenants: list[TenantConfig] = Field(
        default_factory=list, description="No tenants = open access (for local use)."
    )

    @model_validator(mode="after")
    def _names_are_unique(self) -> AuthConfig:
        names = [t.name for t in self.tenants]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"auth.tenants: duplicate tenant name(s) {duplicates}")
        return self


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True


class AppConfig(StrictModel):
    ingress: IngressConfig = IngressConfig()
    auth: AuthConfig = AuthConfig()
    # Any non-empty combination of tasks is an app; see _serves_a_model.
    embedding_models: list[EmbeddingModelConfig] = Field(default_factory=list)
    rerank_models: list[RerankModelConfig] = Field(default_factory=list)
    generation_models: list[GenerationModelConfig] = Field(default_factory=list)

    @model_validator(mode="after")
    def _serves_a_model(self) -> AppConfig:
        if not (self.embedding_models or self.rerank_models or self.generation_models):
            raise ValueError(
                "no models: name at least one in embedding_models, rerank_models or "
                "generation_models"
            )
        return self

    @model_validator(mode="after")
    def _names_are_unique(self) -> AppConfig:
        # One namespace: a client names a model without saying which task it is for.
        names = [m.name for m in self.embedding_models] + [m.name for m in self.rerank_models]
        names += [m.name for m in self.generation_models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"model names: duplicate model name(s) {duplicates}")
        for tenant in self.auth.tenants:
            unknown = sorted(set(tenant.models or ()) - set(names))
            if unknown:
                raise ValueError(f"tenant {tenant.name!r} names unknown model(s) {unknown}")
        return self
