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
