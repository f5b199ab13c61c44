"""The configs of the encoder models, embedding and rerank: which runtime runs their forward
pass (docs/backends.md), its memory fences, and their request limits (`config/base.py` has
what every model has)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from deployments.config.base import ModelDeploymentConfig
from deployments.config.output_neutral import OutputNeutral

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

# The runtimes `memory_limit_mib` allows (auto: then among these).
TORCH_RUNTIMES = frozenset({"torch", "auto", "torch-fp32", "torch-bf16", "torch-fp16"})

PassCount = Annotated[int, Field(ge=1, le=16)]


class EncoderModelConfig(ModelDeploymentConfig):
    """An embedding or rerank model: which backend runs its forward pass (docs/backends.md)."""

    runtime: Runtime = Field(
        "torch",
        description="torch: torch in `dtype`; auto: measured at warm-up, the fastest "
        "candidate the hardware has whose output agrees with fp32 (runtime_min_agreement); "
        "or one named: torch-fp32/-bf16/-fp16 (fp16 on a GPU only), openvino (f32), "
        "openvino-bf16, onnx (ONNX Runtime fp32), onnx-int8 (opt-in, less exact).",
    )
    passes_in_flight: OutputNeutral[PassCount | Literal["auto"]] = Field(
        1,
        description="Forward passes the replica runs at once, each on its own model thread "
        "with torch_threads / passes threads (a runtime stream each): on a small CPU two "
        "one-thread passes can finish more texts a second than one two-thread pass. auto: "
        "measured at warm-up against one pass and kept on disk with the runtime's choice "
        "(one pass on a GPU).",
    )
    realtime_lane: OutputNeutral[bool | Literal["auto"]] = Field(
        "auto",
        description="A thread of the replica's own (a quarter of torch_threads, at least "
        "one) that runs a realtime batch beside the pass holding the others, instead of "
        "after it: a pass cannot be interrupted, and a batch-class pass would otherwise "
        "add its length to a realtime request's latency. auto: on a CPU, unless "
        "memory_limit_mib is set; never on a GPU, whose passes queue on the card anyway.",
    )
    runtime_min_agreement: OutputNeutral[float] = Field(
        0.999,
        gt=0,
        le=1,
        description="auto: least agreement with torch fp32 a candidate needs: the worst "
        "vector's cosine (embeddings, bi-encoder), the scores' correlation (cross-encoder).",
    )
    cache_dir: OutputNeutral[str | None] = Field(
        None, description="Where exported graphs are built; default ~/.cache/tributary."
    )
    gpu_memory_fraction: OutputNeutral[float | None] = Field(
        None,
        gt=0,
        le=1,
        description="On a GPU: the most of the card's memory this replica's process may "
        "take (torch's per-process fraction); a pass beyond it runs out of memory and is "
        "split and retried. None = no fence.",
    )
    memory_limit_mib: OutputNeutral[int | None] = Field(
        None,
        ge=1,
        description="On a Linux CPU: the address space the replica may add after warm-up; a "
        "pass beyond it fails in the allocator and is split and retried instead of the "
        "kernel ending the replica. Torch runtimes only (auto then keeps torch fp32). "
        "None = no limit.",
    )
    memory_budget_mib: int | None = Field(
        None,
        ge=1,
        description="Memory one forward pass may add beyond the loaded model: at warm-up "
        "the replica measures passes of growing size and caps every class's "
        "max_batch_tokens where a pass would reach this budget (docs/operations.md, "
        "'Memory budgets'). On a GPU it bounds the probe's fraction too. None = on a CPU "
        "no ceiling from memory.",
    )
    probe_memory_fraction: float | None = Field(
        0.8,
        gt=0,
        le=1,
        description="On a GPU: at warm-up, probe passes up to this fraction of the free "
        "device memory and cap every class's max_batch_tokens at what fits in it. Ignored "
        "on a CPU. None = no probe.",
    )

    @model_validator(mode="after")
    def _memory_limit_needs_torch(self) -> EncoderModelConfig:
        # Only torch fails cleanly at the limit; OpenVINO was seen to hand back its previous
        # (smaller) output, and the split-and-retry is built and tested on torch.
        if self.memory_limit_mib is not None and self.runtime not in TORCH_RUNTIMES:
            raise ValueError(
                f"memory_limit_mib works with torch runtimes only, not runtime: "
                f"{self.runtime}; use runtime: auto (which then keeps torch fp32) or "
                "torch, torch-fp32, torch-bf16"
            )
        if self.memory_limit_mib is not None and self.passes_in_flight not in (1, "auto"):
            # The limit is fitted to one pass's growth; auto keeps one pass under it.
            raise ValueError(
                "memory_limit_mib runs one forward pass at a time: use passes_in_flight: 1 "
                f"or auto, not {self.passes_in_flight}"
            )
        return self

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
    max_inputs: OutputNeutral[int] = Field(
        2048, ge=1, description="Most inputs in one request (413)."
    )
    accept_token_ids: OutputNeutral[bool] = Field(
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
    max_documents: OutputNeutral[int] = Field(
        1000, ge=1, description="Most documents in one request (413)."
    )
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
    max_chunk_passes: OutputNeutral[int] = Field(
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
