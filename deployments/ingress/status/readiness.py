"""`GET /healthz`: is every deployment able to serve?

Ready means every deployment of every application has at least one running replica
(a model replica only runs once it has loaded and warmed up) and none is failing.
A deployment that is scaling up or down, or rolling out an update, with replicas
already running, still serves: with autoscaling on, answering 503 then would make a
load balancer drop a healthy server whenever load changed. So does one that has had all
its replicas running once and lost one since (Serve says UNHEALTHY until the replacement
runs): the others serve, a generation model's standby among them, and a 503 would make a
load balancer drop the node for the ~10 s a replacement takes. Until a deployment has
been seen whole, every replica it starts must be running.

Serve's status changes only after its health-check period (seconds), so a generation
replica is also asked directly whether its engine runs (`engine_alive`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger("ray.serve")

SERVING_STATUSES = frozenset({"HEALTHY", "UPSCALING", "DOWNSCALING", "UPDATING"})
# How long /healthz waits for a generation replica to say whether its engine runs. A
# replica too busy to answer within it is not reported down: Serve's own health check
# covers a replica that stopped answering, and a busy one must not flap the endpoint.
ENGINE_CHECK_TIMEOUT_S = 1.0


def readiness_problem(
    deployments: Mapping[str, Any], seen_whole: set[str] | None = None
) -> str | None:
    """`deployments`: "app/name" -> an object with `status` and `replica_states`
    (Serve's DeploymentStatusOverview). None when all can serve, else why not.
    `seen_whole`: the deployments seen with every replica running; this adds to it."""
    seen = set() if seen_whole is None else seen_whole
    for name, deployment in deployments.items():
        status = str(getattr(deployment.status, "value", deployment.status))
        running = deployment.replica_states.get("RUNNING", 0)
        lost_one = status == "UNHEALTHY" and name in seen
        if status not in SERVING_STATUSES and not lost_one:
            return f"Deployment {name} is {status}."
        if not running:
            return f"Deployment {name} has no running replica yet ({status})."
        starting = {
            state: count
            for state, count in deployment.replica_states.items()
            if state != "RUNNING" and count
        }
        if status == "HEALTHY" and not starting:
            seen.add(name)
        elif status == "HEALTHY" and name not in seen:
            return f"Deployment {name} has replicas {starting}."
    return None


async def serve_readiness(seen_whole: set[str] | None = None) -> str | None:
    from ray import serve

    try:
        status = await asyncio.to_thread(serve.status)
    except Exception:
        logger.exception("could not read Serve's status")
        return "Serve's status is unavailable."
    return readiness_problem(
        {
            f"{app_name}/{name}": deployment
            for app_name, app in status.applications.items()
            for name, deployment in app.deployments.items()
        },
        seen_whole,
    )


async def engines_problem(
    generators: Mapping[str, Any], timeout_s: float = ENGINE_CHECK_TIMEOUT_S
) -> str | None:
    """`generators`: model name -> handle of its Generator. Asks each at once whether its
    engine is alive; None when none says no, else which is down."""
    names = list(generators)
    answers = await asyncio.gather(*(_engine_alive(generators[name], timeout_s) for name in names))
    down = [name for name, alive in zip(names, answers, strict=True) if alive is False]
    if down:
        listed = ", ".join(f"'{name}'" for name in down)
        return f"The generation engine of model {listed} is down; it is restarting."
    return None


async def _engine_alive(handle: Any, timeout_s: float) -> bool | None:
    """True or False as the replica says, None when it could not say in time."""
    try:
        return bool(await asyncio.wait_for(handle.engine_alive.remote(), timeout_s))
    except TimeoutError:
        logger.warning("a generation replica did not say within %.1f s if it runs", timeout_s)
        return None
    except Exception as exc:
        logger.warning("a generation replica could not say if its engine runs: %r", exc)
        return False
