"""Standby replicas of a generation model (ingress/calls/standby.py, config/generation.py):
which replicas serve and which stand by, the same in every router, and the standby serving
once a serving replica is gone. Served: tests/reliability/test_replica_kill.py, where the
default app's standby takes over from a killed replica."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError

from deployments.config import GenerationModelConfig
from deployments.ingress.calls.standby import StandbyCounts, replica_roles
from deployments.launch.placement import demand_of


def replica(unique_id: str) -> Any:
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=unique_id))


def ids(replicas: list[Any]) -> list[str]:
    return [r.replica_id.unique_id for r in replicas]


def test_the_first_replicas_by_id_serve_and_the_rest_stand_by() -> None:
    b, a, c = replica("b"), replica("a"), replica("c")
    roles = replica_roles([b, a, c], serving=1)
    assert ids(roles.serving) == ["a"] and ids(roles.standing_by) == ["b", "c"]
    # Every router picks the same, whatever order Serve lists the replicas in.
    assert ids(replica_roles([c, b, a], serving=1).serving) == ["a"]
    assert ids(replica_roles([c, a, b], serving=2).serving) == ["a", "b"]


def test_when_a_serving_replica_is_gone_a_standby_serves() -> None:
    a, b = replica("a"), replica("b")
    assert ids(replica_roles([a, b], serving=1).serving) == ["a"]
    after_kill = replica_roles([b], serving=1)
    assert ids(after_kill.serving) == ["b"] and after_kill.standing_by == []
    # The replacement comes up; the standby it became serving stays so only if its id is
    # first: the choice is by id, the same in every ingress process.
    assert ids(replica_roles([b, replica("0")], serving=1).serving) == ["0"]
    assert ids(replica_roles([b, replica("z")], serving=1).serving) == ["b"]


def test_without_standby_replicas_every_replica_serves() -> None:
    replicas = [replica("b"), replica("a")]
    assert ids(replica_roles(replicas, serving=None).serving) == ["b", "a"]
    assert ids(replica_roles(replicas, serving=2).serving) == ["b", "a"]
    assert replica_roles([], serving=1).serving == []


def test_counts_are_kept_per_deployment() -> None:
    counts = StandbyCounts()
    assert counts.of("generate") is None
    counts.saw("generate", replica_roles([replica("a"), replica("b")], serving=1))
    assert counts.of("generate") == {"serving": 1, "standing_by": 1, "passed_over": 0}


def generation(**fields: Any) -> GenerationModelConfig:
    return GenerationModelConfig.model_validate(
        {"name": "llm", "source": "demo:tiny-llama", **fields}
    )


def test_standby_replicas_are_started_beside_the_serving_count() -> None:
    from deployments.app import _generator

    model = generation(standby_replicas=1, deployment={"num_replicas": 2})
    deployment = _generator("generate", model, "system")._bound_deployment
    assert deployment.num_replicas == 3
    router = deployment._deployment_config.request_router_config
    assert router.request_router_kwargs == {"serving_replicas": 2}
    # The launcher's count of what the config asks includes them.
    assert demand_of("llm", model.deployment, model.standby_replicas).replicas == 3
    # Without standby replicas, Serve's count is the config's and no kwargs go to the router.
    plain = _generator("generate", generation(), "system")._bound_deployment
    assert plain.num_replicas == 1
    assert plain._deployment_config.request_router_config.request_router_kwargs == {}


def test_standby_replicas_need_a_fixed_replica_count() -> None:
    scaling = {"autoscaling_config": {"min_replicas": 1, "max_replicas": 2}}
    with pytest.raises(ValidationError, match="standby_replicas needs a fixed"):
        generation(standby_replicas=1, deployment=scaling)
    assert generation(deployment=scaling).standby_replicas == 0


def test_every_router_serve_makes_shares_the_processs_records() -> None:
    """Serve pickles the router's module by value into each router it makes: the records
    of runs and replica roles must still be the process's own, not a copy per router (a
    copy made /v1/stats read an empty one while the routers filled theirs)."""
    from ray.serve.config import RequestRouterConfig

    from deployments.app import GENERATION_ROUTER
    from deployments.ingress.calls import (
        generation_router,
        silent_replicas,
        standby,
        stop_note_router,
    )

    router = RequestRouterConfig(request_router_class=GENERATION_ROUTER).get_request_router_class()
    seen = router.choose_replicas.__globals__
    assert seen is not vars(generation_router)  # the module's names, copied
    assert seen["stop_note_router"].RUNS is stop_note_router.RUNS
    assert seen["standby"].STANDBY_COUNTS is standby.STANDBY_COUNTS
    assert seen["silent_replicas"].SILENT is silent_replicas.SILENT
