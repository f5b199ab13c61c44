"""Under load a model deployment grows from one replica to two; idle, it shrinks back.

Admission by predicted wait keeps the queue at the model short (what cannot be answered in
time is refused), so the calls waiting there never ask for a replica; the replica's busy
share does (replicas/busy_scaling.py): one replica computing all the time asks for two, idle
ones for the minimum. The test config's delays are seconds instead of
serve_config.gpu.yaml's minutes."""

from __future__ import annotations

import asyncio

import httpx

from tests.cluster.conftest import APP, SCALING_MODEL, DeployedCluster
from tests.cluster.local_cluster import running, wait_for
from tests.cluster.traffic import closed_loop, one_request

DEPLOYMENT = f"embed-{SCALING_MODEL}"


async def test_a_model_deployment_scales_out_under_load_and_back_in_when_idle(
    deployed: DeployedCluster,
) -> None:
    cluster = deployed.cluster

    def replica_count() -> tuple[int, int]:
        replicas = cluster.replicas(APP, DEPLOYMENT)
        return len(running(replicas)), len(replicas)

    await asyncio.to_thread(wait_for, "one replica at rest", lambda: replica_count() == (1, 1), 60)

    stop = asyncio.Event()
    load = asyncio.create_task(closed_loop(deployed.url, SCALING_MODEL, clients=8, stop=stop))
    try:
        await asyncio.to_thread(
            wait_for, "a second running replica", lambda: replica_count()[0] == 2, 120
        )
    finally:
        stop.set()
        outcomes = await load
    # Answered, or refused as the API promises while one replica cannot keep up.
    assert any(o.ok for o in outcomes)
    assert all(o.ok or o.refused for o in outcomes), [o for o in outcomes if not o.ok][:5]

    await asyncio.to_thread(
        wait_for, "back to one replica when idle", lambda: replica_count() == (1, 1), 90
    )
    async with httpx.AsyncClient() as client:
        after = await one_request(client, deployed.url, SCALING_MODEL, 4, 30)
    assert after.ok, after
