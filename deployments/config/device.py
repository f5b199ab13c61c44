"""Turns at a shared device: how the models on one device (a node's CPU, one GPU) order
their forward passes across models (docs/operations.md, "Sharing a device")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from deployments.config.strict import StrictModel


class DeviceArbiterConfig(StrictModel):
    """The device's side, the same for every model on it: set once for the app under
    `device_arbiter:` (a model served as an application of its own sets it in its own
    config)."""

    enabled: bool = Field(
        True,
        description="Replicas that share a device take a turn before each forward pass (each "
        "engine step for the LLM), the most urgent first. False = each model runs its passes "
        "whenever it has them, as if alone.",
    )
    passes_at_once: int | Literal["auto"] = Field(
        "auto",
        description="Passes that may run at once on one device. auto: on a CPU, its cores, "
        "each pass weighing its model's torch threads, and a pass starts while a core is "
        "unclaimed (one at a time when every model uses every core); on a GPU, 4 (one at "
        "a time left an H200 idle between small models' passes; set 1 for models whose "
        "passes fill the card).",
    )
    max_hold_s: float = Field(
        30.0,
        gt=0,
        description="A turn held longer than this (a hung pass) is taken back, so the device "
        "is never held by a replica that stopped answering. A dead replica's turn is taken "
        "back within 0.1 s.",
    )
    pause_for_realtime: bool = Field(
        True,
        description="On a CPU: while a realtime pass runs, the other models' replicas that "
        "hold the cores for a lower class are stopped (SIGSTOP) and go on when it ends "
        "(SIGCONT), so a realtime pass never shares the cores with a batch that started just "
        "before it. A stop lasts one realtime pass (at most 0.5 s); a model below its "
        "min_share is not stopped. No effect on a GPU.",
    )
    share_window_s: float = Field(
        2.0,
        gt=0,
        description=(
            "Time constant of the recent busy time that shares are measured over: "
            "`min_share`, and the order between passes otherwise equal."
        ),
    )


class DeviceTurnsConfig(StrictModel):
    """A model's own place at its device."""

    priority: int = Field(
        0,
        description="Across models of the same request class, the model with the higher "
        "priority takes the device first.",
    )
    min_share: float = Field(
        0.05,
        ge=0,
        le=1,
        description="The share of the device's recent busy time this model gets while it "
        "has passes waiting, whatever its class and priority: the ageing that keeps a "
        "low-priority model moving.",
    )
