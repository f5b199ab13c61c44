"""Whether the machine can place the config's replicas, and saying so when it cannot.

Serve keeps a replica that no node has room for waiting "to be scheduled" forever, and
`serve run` says nothing: two versions of the embedder at `num_cpus: 1` on a 2-core
machine left the ingress unscheduled and `make serve` silent (issue 31). The launcher
therefore
- before deploying, adds up what the config's deployments ask (each replica's num_cpus,
  num_gpus and memory times the replicas it starts with) and refuses a config whose sum is more
  than the Ray it started has: no placement can fit it, whatever the order;
- while the applications start, looks at each of Serve's statuses the start-up watch
  (start_watch.py) reads for a deployment whose replicas
  "have taken more than 30s to be scheduled" (what a sum cannot see: a replica too big for
  any one node, GPU fractions that do not pack, an application of another builder), and
  gives up once that has lasted the bound, with Serve's reason and the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from deployments.config import GenerationModelConfig, ModelDeploymentConfig
from deployments.config.serve_options import DeploymentOptions
from deployments.config.traffic import ModelAppConfig
from deployments.launch.config_file import (
    APP_BUILDER,
    MODEL_APP_BUILDER,
    app_name,
    applications,
    built_app_config,
)
from deployments.launch.start_watch import Verdict

# Ray's resource names for ray_actor_options' num_cpus, num_gpus and memory (bytes).
RESOURCES = ("CPU", "GPU", "memory")
# What Serve writes into a deployment's status message while its replicas wait for room
# (ray/serve/_private/deployment_state.py), not the one for replicas slow to initialise.
UNSCHEDULED = "to be scheduled"
DEFAULT_TIMEOUT_S = 90.0
EXIT_UNPLACEABLE = 3
MIB = 1024 * 1024
FIX = (
    "lower num_cpus, num_gpus or memory in the deployments' ray_actor_options, or "
    "num_replicas (min_replicas), or run on a machine with more"
)


@dataclass(frozen=True)
class Demand:
    """What one deployment asks to start: `replicas` times `each`."""

    label: str
    replicas: int
    each: Mapping[str, float]

    def total(self, resource: str) -> float:
        return self.replicas * self.each.get(resource, 0.0)


def demand_of(label: str, options: DeploymentOptions, standby: int = 0) -> Demand:
    """`standby`: a generation model's `standby_replicas`, started beside its count."""
    actor = options.ray_actor_options
    each = {"CPU": actor.num_cpus, "GPU": actor.num_gpus, "memory": float(actor.memory or 0)}
    return Demand(label, options.starting_replicas + standby, each)


def _model_demand(label: str, model: ModelDeploymentConfig) -> Demand:
    standby = model.standby_replicas if isinstance(model, GenerationModelConfig) else 0
    return demand_of(label, model.deployment, standby)


def _model_label(kind: str, model: ModelDeploymentConfig) -> str:
    return f"{kind} model {model.name}" + (f"@{model.version}" if model.version != "1" else "")


def application_demands(application: Mapping[str, Any]) -> list[Demand] | None:
    """The deployments one application of the Serve config starts; None when that cannot be
    known here (another builder, Serve-level `deployments:` overrides, args Serve itself
    will refuse)."""
    builder = application.get("import_path")
    if application.get("deployments") or builder not in (APP_BUILDER, MODEL_APP_BUILDER):
        return None
    app = app_name(application)
    if builder == MODEL_APP_BUILDER:
        try:
            one = ModelAppConfig.model_validate(application.get("args") or {})
        except ValidationError:
            return None
        models: list[tuple[str, ModelDeploymentConfig | None]] = [
            ("embedding", one.embedding_model),
            ("rerank", one.rerank_model),
            ("generation", one.generation_model),
        ]
        return [
            _model_demand(f"{app}: {_model_label(kind, model)}", model)
            for kind, model in models
            if model is not None
        ]
    config = built_app_config(application)
    if config is None:
        return None
    demands = [demand_of(f"{app}: ingress", config.ingress.deployment)]
    for kind, listed in (
        ("embedding", config.embedding_models),
        ("rerank", config.rerank_models),
        ("generation", config.generation_models),
    ):
        demands += [_model_demand(f"{app}: {_model_label(kind, m)}", m) for m in listed]
    return demands


def config_demands(config: Mapping[str, Any]) -> tuple[list[Demand], list[str]]:
    """Every deployment the config starts that can be known here, and the names of the
    applications that could not be counted."""
    demands: list[Demand] = []
    unknown: list[str] = []
    for application in applications(config):
        found = application_demands(application)
        if found is None:
            unknown.append(app_name(application))
        else:
            demands += found
    return demands, unknown


def shortfall(demands: list[Demand], cluster: Mapping[str, float]) -> dict[str, float]:
    """Each resource the demands ask more of than the cluster has: the amount asked.
    Ray counts resources in steps of 1/10,000, so smaller differences are rounding."""
    short = {}
    for resource in RESOURCES:
        asked = sum(d.total(resource) for d in demands)
        if asked > cluster.get(resource, 0.0) + 1e-4:
            short[resource] = asked
    return short


def _amount(resource: str, value: float) -> str:
    if resource == "memory":
        return f"{value / MIB:,.0f} MiB"
    return f"{value:g}"


def _each(demand: Demand) -> str:
    parts = [f"{r} {_amount(r, demand.each[r])}" for r in RESOURCES if demand.each.get(r)]
    return ", ".join(parts) or "nothing"


def arithmetic(demands: list[Demand], cluster: Mapping[str, float]) -> list[str]:
    """The config's asks per deployment and in total, against what the cluster has."""
    width = max((len(d.label) for d in demands), default=0)
    lines = [f"  {d.label:<{width}}  {d.replicas} x {_each(d)}" for d in demands]
    for resource in RESOURCES:
        asked = sum(d.total(resource) for d in demands)
        if asked or resource == "CPU":
            has = cluster.get(resource, 0.0)
            lines.append(
                f"  {resource}: the config asks {_amount(resource, asked)}, "
                f"this Ray has {_amount(resource, has)}"
            )
    return lines


def placement_problem(config: Mapping[str, Any], cluster: Mapping[str, float]) -> str | None:
    """The message refusing a config the cluster can never place; None if it may fit."""
    demands, _ = config_demands(config)
    short = shortfall(demands, cluster)
    if not short:
        return None
    names = " and ".join(short)
    return "\n".join(
        [
            f"the config asks for more {names} than this Ray has, so Serve could never "
            "start every replica:",
            *arithmetic(demands, cluster),
            f"Nothing was deployed. To fix it: {FIX}.",
        ]
    )


def unscheduled(status: Any) -> dict[str, str]:
    """From `serve.status()`: each deployment waiting for room, with Serve's message."""
    return {
        f"{app}/{name}": deployment.message
        for app, overview in status.applications.items()
        for name, deployment in overview.deployments.items()
        if UNSCHEDULED in (deployment.message or "")
    }


class StuckClock:
    """How long some deployment has been waiting for room, without a break."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.since: float | None = None

    def expired(self, stuck: bool, now: float) -> bool:
        """Whether it has lasted the timeout (never, for a timeout of 0)."""
        if not stuck:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return self.timeout_s > 0 and now - self.since >= self.timeout_s


def give_up_message(
    stuck: Mapping[str, str],
    config: Mapping[str, Any],
    cluster: Mapping[str, float],
    waited_s: float,
) -> str:
    demands, unknown = config_demands(config)
    uncounted = f" (not counted: {', '.join(unknown)})" if unknown else ""
    return "\n".join(
        [
            f"Serve could not place every replica for {waited_s:.0f} s; giving up. Serve says:",
            *(f"  {message}" for message in stuck.values()),
            f"What the config asks{uncounted}, against what this Ray has:",
            *arithmetic(demands, cluster),
            f"To fix it: {FIX}. (--placement-timeout-s 0 waits forever, e.g. for a cluster "
            "that is adding nodes.)",
        ]
    )


class PlacementCheck:
    """Says when a deployment starts waiting for room; stops once it has waited
    `timeout_s` without a break (0: never)."""

    exit_status = EXIT_UNPLACEABLE
    stopped_because = "Serve could not place every replica (above: why, and what the config asks)"

    def __init__(
        self,
        config: Mapping[str, Any],
        cluster: Callable[[], Mapping[str, float]],  # ray.cluster_resources
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.config = config
        self.cluster = cluster
        self.timeout_s = timeout_s
        self._clock = StuckClock(timeout_s)

    def look(self, status: Any, now: float) -> Verdict:
        stuck = unscheduled(status)
        fresh = bool(stuck) and self._clock.since is None
        if self._clock.expired(bool(stuck), now):
            waited_s = now - (self._clock.since or now)
            return Verdict([], give_up_message(stuck, self.config, self.cluster(), waited_s))
        return Verdict([self.first_notice(stuck)] if fresh else [])

    def first_notice(self, stuck: Mapping[str, str]) -> str:
        then = (
            f"the launcher gives up if that lasts {self.timeout_s:g} s"
            if self.timeout_s > 0
            else "the launcher waits (--placement-timeout-s 0)"
        )
        return "\n".join(
            [
                f"Serve cannot place every replica yet; {then}. Serve says:",
                *(f"  {message}" for message in stuck.values()),
            ]
        )
