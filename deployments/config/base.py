"""What every model deployment's config has: its batch knobs per priority class and the
fields shared by the embedding, rerank and generation models (`config/app.py` has the rest)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from deployments.config.device import DeviceArbiterConfig, DeviceTurnsConfig
from deployments.config.output_neutral import OutputNeutral
from deployments.config.serve_options import DeploymentOptions
from deployments.config.strict import StrictModel
from deployments.core.priority import PriorityName


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
    alone_max_batch_tokens: int | None = Field(
        None,
        ge=1,
        description="The token budget while no higher class has sent this model anything "
        "for 2 s: a class kept to short passes so that higher ones never wait long behind "
        "them runs full passes while nobody could. None = max_batch_tokens always.",
    )
    alone_max_pass_ms: float = Field(
        200.0,
        gt=0,
        description="The longest a pass at `alone_max_batch_tokens` may be predicted to "
        "take (the measured cost model): the first request of a higher class to come back "
        "waits out at most one such pass. Until the cost model has a fit, no full passes.",
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

    realtime_hold_ms: float = Field(
        30.0,
        ge=0,
        le=1000,
        description="After a realtime pass, how long batch-class batches keep off the "
        "model's free threads, kept for the next realtime batch (realtime requests come in "
        "runs); a batch past the class's aged_after_s goes all the same. 0 = no hold.",
    )
    shared_passes: bool = Field(
        True,
        description="A normal or batch-class pass that starts with room left in its class's "
        "budget takes along whole batches of those two classes that wait for their own turn "
        "(normal's first) when one pass costs no more than the two apart by the fitted cost "
        "model (padding counted), so that under load the model runs fuller passes; a normal pass "
        "takes batch-class batches only while the ingress refuses no normal request and "
        "normal's recent p99 is under half its target. "
        "False = each class's batches run alone.",
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
    """What every model deployment has, whatever its task. A setting that changes how the
    model is run or admitted, never what it returns, is typed `OutputNeutral[...]`: the
    result cache leaves exactly those out of its key (config/output_neutral.py)."""

    name: OutputNeutral[str] = Field(
        ...,
        min_length=1,
        pattern=r"^[^@]+$",
        description="The `model` name clients send (`name@version` pins a version).",
    )
    version: OutputNeutral[str] = Field(
        "1",
        min_length=1,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="Which weights or settings serve this name: several versions of a name "
        "may be served at once (the ingress's traffic policy splits between them). A label "
        "on the request metrics and the X-Model-Version response header.",
    )
    torch_threads: OutputNeutral[int] = Field(
        0, ge=0, description="Intra-op threads for the forward pass; 0 = the actor's num_cpus."
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="Weights' precision; auto = float16 on a GPU Ray assigned, float32 on CPU.",
    )
    batching: OutputNeutral[ModelBatching] = ModelBatching()
    deployment: OutputNeutral[DeploymentOptions] = DeploymentOptions()
    device_turns: OutputNeutral[DeviceTurnsConfig] = DeviceTurnsConfig()
    # The app's `device_arbiter`, copied in by build_app (config/device.py).
    device_arbiter: OutputNeutral[DeviceArbiterConfig] = DeviceArbiterConfig()
