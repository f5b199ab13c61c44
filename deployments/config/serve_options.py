"""Serve's options for one deployment, typed: replicas or autoscaling, and actor resources.

Shared by every model deployment and the ingress in `config/app.py`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from deployments.config.allocator import Allocator, with_allocator
from deployments.config.strict import StrictModel


class ActorOptions(StrictModel):
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    memory: int | None = Field(None, gt=0, description="Bytes of RAM to reserve.")
    runtime_env: dict[str, Any] | None = Field(
        None, description="Ray runtime_env of the replicas, e.g. {env_vars: {...}}."
    )

    def to_ray(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


# Serve imports it by this path where the app is built and pickles it into its controller.
BUSY_POLICY_PATH = "deployments.replicas.busy_scaling:BusyOrQueuePolicy"


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
    target_busy_share: float | None = Field(
        0.7,
        gt=0,
        le=1,
        description="Encoder models: enough replicas that each spends about this share of "
        "its time in forward passes, or as many as Serve's queue target asks for, whichever "
        "is more (replicas/busy_scaling.py). The queue alone never asks under admission by "
        "predicted wait, which keeps it short. None = Serve's own policy.",
    )

    def to_serve(self, busy_policy: bool) -> dict[str, Any]:
        """Serve's `autoscaling_config`; `busy_policy`: the deployment's replicas report
        how busy they are, and the policy that reads it applies."""
        options = self.model_dump(exclude_none=True, exclude={"target_busy_share"})
        if busy_policy and self.target_busy_share is not None:
            options["policy"] = {
                "policy_function": BUSY_POLICY_PATH,
                "policy_kwargs": {"target_busy_share": self.target_busy_share},
            }
        return options

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
    backpressure_retry_after_s: float = Field(
        1,
        ge=0,
        allow_inf_nan=False,
        description="Retry-After of Serve's own 503 when `max_queued_requests` is exceeded "
        "on a deployment that answers HTTP (the ingress); a refusal always says when to retry.",
    )
    health_check_period_s: float = Field(
        2.0,
        gt=0,
        allow_inf_nan=False,
        description="How often Serve's controller asks each replica whether it is healthy. "
        "A replica process that dies is only noticed, and replaced, at its next check: "
        "Serve's own 10 s made a killed replica's replacement start up to 10 s late.",
    )
    health_check_timeout_s: float = Field(
        30.0,
        gt=0,
        allow_inf_nan=False,
        description="A check unanswered this long counts as failed (Serve's default).",
    )
    ray_actor_options: ActorOptions = ActorOptions()

    @model_validator(mode="after")
    def _one_way_to_size(self) -> DeploymentOptions:
        if self.num_replicas is not None and self.autoscaling_config is not None:
            raise ValueError("set num_replicas or autoscaling_config, not both")
        return self

    @property
    def fewest_replicas(self) -> int:
        """The fewest replicas Serve keeps running (autoscaling may not go below it)."""
        if self.autoscaling_config is None:
            return self.num_replicas or 1
        return self.autoscaling_config.min_replicas

    @property
    def starting_replicas(self) -> int:
        """The replicas Serve starts with: autoscaling's initial_replicas, else its floor."""
        scaling = self.autoscaling_config
        if scaling is not None and scaling.initial_replicas is not None:
            return scaling.initial_replicas
        return self.fewest_replicas

    def to_serve(
        self,
        busy_policy: bool = False,
        allocator: Allocator = "system",
        address_space_fenced: bool = False,
    ) -> dict[str, Any]:
        """Serve's options; `busy_policy`: an encoder deployment, whose replicas report how
        busy they are to its autoscaling (`AutoscalingOptions.target_busy_share`);
        `allocator`: the malloc its replicas preload (`config/allocator.py`), which an
        address-space fence keeps on glibc's."""
        options = self.model_dump(
            exclude={"ray_actor_options", "autoscaling_config", "backpressure_retry_after_s"}
        )
        options["backpressure_config"] = {
            "status_code": 503,
            "retry_after_s": self.backpressure_retry_after_s,
        }
        if self.autoscaling_config is not None:
            options.pop("num_replicas")
            options["autoscaling_config"] = self.autoscaling_config.to_serve(busy_policy)
        elif self.num_replicas is None:
            options["num_replicas"] = 1
        options["ray_actor_options"] = with_allocator(
            self.ray_actor_options.to_ray(), allocator, address_space_fenced
        )
        return options
