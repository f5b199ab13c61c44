from types import SimpleNamespace

from deployments.ingress.status.readiness import readiness_problem


def deployment(status: str, **replicas: int) -> SimpleNamespace:
    return SimpleNamespace(status=status, replica_states=replicas)


def test_healthy_with_every_replica_running_is_ready() -> None:
    assert readiness_problem({"app/embed": deployment("HEALTHY", RUNNING=2)}) is None


def test_scaling_with_a_running_replica_is_still_ready() -> None:
    # Autoscaling must not make a load balancer drop a server that is serving.
    for status in ("UPSCALING", "DOWNSCALING", "UPDATING"):
        ready = {"app/embed": deployment(status, RUNNING=1, STARTING=1)}
        assert readiness_problem(ready) is None


def test_no_running_replica_or_a_failure_is_not_ready() -> None:
    starting = readiness_problem({"app/embed": deployment("UPDATING", STARTING=1)})
    assert starting == "Deployment app/embed has no running replica yet (UPDATING)."
    failed = readiness_problem({"app/embed": deployment("DEPLOY_FAILED", RUNNING=1)})
    assert failed == "Deployment app/embed is DEPLOY_FAILED."
    unhealthy = readiness_problem({"app/embed": deployment("UNHEALTHY", RUNNING=1)})
    assert unhealthy is not None


def test_at_start_a_replica_still_loading_keeps_it_not_ready() -> None:
    problem = readiness_problem(
        {
            "app/ingress": deployment("HEALTHY", RUNNING=1),
            "app/embed": deployment("HEALTHY", RUNNING=1, STARTING=1),
        }
    )
    assert problem == "Deployment app/embed has replicas {'STARTING': 1}."


def test_a_deployment_seen_whole_stays_ready_while_a_lost_replica_is_replaced() -> None:
    """A generation model's standby serves while Serve replaces the replica that died: a
    503 then would make a load balancer drop a node that answers."""
    seen: set[str] = set()
    assert readiness_problem({"app/llm": deployment("HEALTHY", RUNNING=2)}, seen) is None
    for status, replicas in (
        ("UNHEALTHY", {"RUNNING": 1}),
        ("UNHEALTHY", {"RUNNING": 1, "STARTING": 1}),
        ("HEALTHY", {"RUNNING": 1, "STARTING": 1}),
    ):
        assert readiness_problem({"app/llm": deployment(status, **replicas)}, seen) is None
    # With none running it is down, seen whole or not; a failed deploy is never ready.
    down = readiness_problem({"app/llm": deployment("UNHEALTHY", STARTING=2)}, seen)
    assert down == "Deployment app/llm has no running replica yet (UNHEALTHY)."
    failed = readiness_problem({"app/llm": deployment("DEPLOY_FAILED", RUNNING=1)}, seen)
    assert failed == "Deployment app/llm is DEPLOY_FAILED."
    # Another deployment, never seen whole, is held to every replica running.
    other = readiness_problem({"app/embed": deployment("UNHEALTHY", RUNNING=1)}, seen)
    assert other == "Deployment app/embed is UNHEALTHY."
