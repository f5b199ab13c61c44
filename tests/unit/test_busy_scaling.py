"""The encoders' autoscaling policy asks for the busier of its two signals: the replicas'
busy share and Serve's own queue of ongoing calls."""

from __future__ import annotations

import pytest
from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve.config import AutoscalingConfig, AutoscalingContext

from deployments.config.serve_options import BUSY_POLICY_PATH, DeploymentOptions
from deployments.replicas.busy_scaling import BUSY_METRIC, BusyOrQueuePolicy

DEPLOYMENT = DeploymentID(name="embed-x", app_name="tributary")


def context(replicas: int, ongoing: float, shares: list[float]) -> AutoscalingContext:
    ids = [ReplicaID(unique_id=f"r{i}", deployment_id=DEPLOYMENT) for i in range(replicas)]
    return AutoscalingContext(
        deployment_id=DEPLOYMENT,
        deployment_name=DEPLOYMENT.name,
        app_name=DEPLOYMENT.app_name,
        current_num_replicas=replicas,
        target_num_replicas=replicas,
        running_replicas=ids,
        total_num_requests=ongoing,
        total_queued_requests=0.0,
        aggregated_metrics={BUSY_METRIC: dict(zip(ids, shares, strict=False))},
        raw_metrics={},
        capacity_adjusted_min_replicas=1,
        capacity_adjusted_max_replicas=4,
        policy_state={},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=None,
        config=AutoscalingConfig(min_replicas=1, max_replicas=4, target_ongoing_requests=2),
    )


def test_a_busy_replica_with_a_short_queue_asks_for_more() -> None:
    # Admission keeps one call open: the queue alone asks for half a replica.
    desired, _ = BusyOrQueuePolicy(target_busy_share=0.7)(context(1, 1.0, [0.98]))
    assert desired == pytest.approx(0.98 / 0.7)


def test_a_long_queue_still_asks_when_the_replicas_report_little() -> None:
    desired, _ = BusyOrQueuePolicy(target_busy_share=0.7)(context(2, 12.0, [0.2, 0.2]))
    assert desired == pytest.approx(6.0)  # 12 calls at a target of 2 each


def test_replicas_that_have_not_reported_count_as_busy_as_the_rest() -> None:
    desired, _ = BusyOrQueuePolicy(target_busy_share=0.5)(context(2, 0.0, [0.5]))
    assert desired == pytest.approx(2.0)


def test_idle_replicas_ask_for_none_and_serves_bounds_decide() -> None:
    desired, _ = BusyOrQueuePolicy()(context(2, 0.0, [0.0, 0.0]))
    assert desired == 0.0


def test_only_encoder_deployments_get_the_policy_and_none_turns_it_off() -> None:
    options = DeploymentOptions.model_validate(
        {"autoscaling_config": {"min_replicas": 1, "max_replicas": 3, "target_busy_share": 0.6}}
    )
    policy = options.to_serve(busy_policy=True)["autoscaling_config"]["policy"]
    assert policy == {
        "policy_function": BUSY_POLICY_PATH,
        "policy_kwargs": {"target_busy_share": 0.6},
    }
    assert "policy" not in options.to_serve()["autoscaling_config"]
    plain = DeploymentOptions.model_validate(
        {"autoscaling_config": {"max_replicas": 3, "target_busy_share": None}}
    )
    serve_options = plain.to_serve(busy_policy=True)["autoscaling_config"]
    assert "policy" not in serve_options and "target_busy_share" not in serve_options
    # Serve takes what we hand it, and finds the policy by its path.
    config = AutoscalingConfig(**options.to_serve(busy_policy=True)["autoscaling_config"])
    policy = config.policy.get_policy()(target_busy_share=0.6)  # what the controller runs
    assert policy(context(1, 0.0, [0.6]))[0] == pytest.approx(1.0)
