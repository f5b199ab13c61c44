"""Typed application arguments: everything under `args:` in serve_config.yaml.

`build_app` validates the raw dict with `AppConfig.model_validate`, so a bad config fails
at build time with pydantic's message, which names the offending field path.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from deployments.config.allocator import Allocator
from deployments.config.base import ModelDeploymentConfig
from deployments.config.batches import BatchesConfig
from deployments.config.cache import CacheConfig
from deployments.config.device import DeviceArbiterConfig
from deployments.config.encoders import EmbeddingModelConfig, RerankModelConfig
from deployments.config.generation import GenerationModelConfig
from deployments.config.serve_options import ActorOptions, DeploymentOptions
from deployments.config.strict import StrictModel
from deployments.core.priority import PriorityName


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
    target_ms: float | None = Field(
        None,
        gt=0,
        description="Latency target from arrival to answer: with `predict_wait`, a request "
        "predicted to take longer (or longer than its deadline) is refused at once. None = "
        "the class's default (realtime 100, normal 500, batch 30,000); a model's "
        "`batching.<class>.target_p99_ms`, where set, takes its place for that model "
        "(docs/operations.md, 'Admission by predicted wait').",
    )


# The classes' targets where the config names none: realtime is interactive, normal is
# a page or an API call behind one, batch is bulk work that only has to keep moving.
DEFAULT_TARGET_MS: dict[PriorityName, float] = {"realtime": 100, "normal": 500, "batch": 30_000}


class AdmissionConfig(StrictModel):
    realtime: ClassAdmission = ClassAdmission(max_queued_items=512, timeout_s=10)
    normal: ClassAdmission = ClassAdmission(
        max_queued_items=4096, shed_above_queued_items=3072, timeout_s=60
    )
    batch: ClassAdmission = ClassAdmission(
        max_queued_items=1024, shed_above_queued_items=1024, timeout_s=600
    )
    max_held_requests: int = Field(
        768,
        ge=1,
        description="Requests (embedding and rerank) one ingress replica holds at once, all "
        "models together; past half of it batch is refused, past 85 % normal, past all of "
        "it realtime (429/503 + Retry-After). Keep it under HAProxy's per-replica "
        "maxconn (TRIBUTARY_INGRESS_MAXCONN, 1024), so nothing waits unseen in front.",
    )
    predict_wait: bool = Field(
        True,
        description="Admit by predicted wait: the work ahead of a request (in tokens, "
        "estimated from its text) over the model's measured service rate, corrected by "
        "measured waits, against its class's target or deadline; a request that finds "
        "nothing ahead is always admitted. False = the item bounds alone (they are "
        "ceilings either way). Autoscaled encoders scale by how busy their replicas are, "
        "since the queue it keeps short would not ask (docs/operations.md).",
    )
    front_door_headroom: float | None = Field(
        1.1,
        gt=1,
        description="With HAProxy in front (the `throughput` and `haproxy` modes), it "
        "refuses at random a share of normal- and batch-class embedding and rerank requests "
        "before they cost Python anything, sized so that admission still sees this many "
        "times what it admits (docs/operations.md, 'Refusing at the front door'). None = "
        "HAProxy refuses only past its own queue bound.",
    )
    max_timeout_s: float = Field(
        3600, gt=0, description="Largest X-Request-Timeout accepted (400 above it)."
    )

    def of(self, priority: PriorityName) -> ClassAdmission:
        return getattr(self, priority)

    def target_ms(self, priority: PriorityName) -> float:
        own = self.of(priority).target_ms
        return DEFAULT_TARGET_MS[priority] if own is None else own

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
    realtime_replica: bool = Field(
        False,
        description="Keep one ingress replica for `X-Priority: realtime` requests and send "
        "it nothing else, so that realtime does not wait on an event loop busy with a flood "
        "of the other classes. Needs HAProxy in front (the launcher's default mode) and at "
        'least two ingress replicas (docs/operations.md, "A replica for realtime").',
    )
    deployment: DeploymentOptions = DeploymentOptions(
        max_ongoing_requests=512,
        max_queued_requests=1024,
        ray_actor_options=ActorOptions(num_cpus=0.5),
    )

    @model_validator(mode="after")
    def _realtime_replica_has_company(self) -> IngressConfig:
        least = self.deployment.fewest_replicas
        if self.realtime_replica and least < 2:
            raise ValueError(
                "realtime_replica keeps one ingress replica for realtime: give the ingress "
                f"at least 2 replicas (deployment.num_replicas or autoscaling_config."
                f"min_replicas), not {least}"
            )
        return self


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
    cache: CacheConfig = CacheConfig()  # the per-item result cache (config/cache.py)
    batches: BatchesConfig = BatchesConfig()  # the OpenAI Batch API (config/batches.py)
    # Turns at a device the models share (config/device.py).
    device_arbiter: DeviceArbiterConfig = DeviceArbiterConfig()
    allocator: Allocator = Field(
        "jemalloc",
        description="The malloc of every replica: jemalloc (Ray's own copy, preloaded; glibc's "
        "arenas let replicas' memory creep by tens of MiB an hour) or the system's "
        "(config/allocator.py).",
    )
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
        # One namespace: a client names a model without saying which task it is for. A
        # name may have several versions within its task (gray release), each once.
        tasks: dict[str, Sequence[ModelDeploymentConfig]] = {
            "embedding": self.embedding_models,
            "rerank": self.rerank_models,
            "generation": self.generation_models,
        }
        task_of: dict[str, str] = {}
        seen: set[tuple[str, str]] = set()
        for task, models in tasks.items():
            for model in models:
                if task_of.setdefault(model.name, task) != task:
                    raise ValueError(f"model names: {model.name!r} names models of two tasks")
                if (model.name, model.version) in seen:
                    raise ValueError(
                        f"model names: {model.name!r} version {model.version!r} is listed twice"
                    )
                seen.add((model.name, model.version))
        for tenant in self.auth.tenants:
            unknown = sorted(set(tenant.models or ()) - set(task_of))
            if unknown:
                raise ValueError(f"tenant {tenant.name!r} names unknown model(s) {unknown}")
        return self
