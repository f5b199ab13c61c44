"""Losing a node under load: its in-flight requests fail fast with a clear 5xx, the
replica on the surviving node keeps serving, and once a node joins again (what KubeRay or
the cluster autoscaler does for a lost one) Serve is back to its target replica count.

The replacement replica has to wait for a new node: each node offers one model slot and
the head's is taken. That is the cluster case worth proving: Serve keeps the replica it
cannot place pending and puts it on the node that arrives, with no operator action."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.cluster.conftest import APP, SPREAD_MODEL, DeployedCluster
from tests.cluster.local_cluster import Node, running, wait_for
from tests.cluster.traffic import Outcome, closed_loop, one_request

DEPLOYMENT = f"embed-{SPREAD_MODEL}"
CLIENT_TIMEOUT_S = 30  # the clients' deadline: no request may hang until it
FAIL_FAST_S = 10  # a request caught on the lost node is answered within this
SETTLED_AFTER_S = 8  # requests sent this long after the loss all succeed


def replica_pids(deployed: DeployedCluster) -> set[int]:
    return {r["pid"] for r in running(deployed.cluster.replicas(APP, DEPLOYMENT))}


def replicas_by_node(deployed: DeployedCluster, nodes: list[Node]) -> dict[str, int]:
    """How many running replicas of the spread model each node's processes hold."""
    pids = replica_pids(deployed)
    return {node.name: len(pids & node.pids()) for node in nodes}


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


async def until_computing(pid: int, timeout_s: float = 10) -> None:
    """Returns once the process burns CPU (a forward pass, so a call is in flight there):
    the node is then lost with work on it, not between two calls."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = cpu_ticks(pid)
        await asyncio.sleep(0.1)
        if cpu_ticks(pid) - before >= 5:  # >= 50 ms of CPU in 100 ms
            return


def assert_clear_5xx(outcome: Outcome) -> None:
    assert outcome.status is not None and 500 <= outcome.status < 600, outcome
    error = outcome.body["error"]
    assert {"message", "type", "code"} <= error.keys(), outcome
    assert "Traceback" not in error["message"], outcome


async def test_losing_a_node_fails_its_requests_fast_and_serve_recovers(
    deployed: DeployedCluster,
) -> None:
    head, worker = deployed.head, deployed.cluster.nodes[-1]
    placement = await asyncio.to_thread(
        wait_for,
        "one spread replica on each node",
        lambda: replicas_by_node(deployed, [head, worker]) == {head.name: 1, worker.name: 1},
        60,
    )
    assert placement

    stop = asyncio.Event()
    load = asyncio.create_task(
        closed_loop(deployed.url, SPREAD_MODEL, clients=6, stop=stop, timeout_s=CLIENT_TIMEOUT_S)
    )
    await asyncio.sleep(4)
    (on_worker,) = replica_pids(deployed) & worker.pids()
    await until_computing(on_worker)
    lost_at = time.monotonic()
    await asyncio.to_thread(worker.kill)
    await asyncio.sleep(SETTLED_AFTER_S + 4)
    stop.set()
    outcomes = await load

    assert all(o.status is not None for o in outcomes), "a request hung or lost its connection"
    before = [o for o in outcomes if o.started + o.seconds < lost_at]
    assert before and all(o.ok for o in before)
    failed = [o for o in outcomes if not o.ok]
    assert failed, "no request was in flight on the lost node; nothing was proven"
    for outcome in failed:
        assert_clear_5xx(outcome)
        assert outcome.seconds < FAIL_FAST_S, outcome
    settled = [o for o in outcomes if o.started > lost_at + SETTLED_AFTER_S]
    assert settled and all(o.ok for o in settled), [o for o in settled if not o.ok][:5]

    # A node takes the lost one's place; Serve fills it without being told.
    replacement = await asyncio.to_thread(deployed.add_worker)
    await asyncio.to_thread(
        wait_for,
        "the spread model back to one replica per node",
        lambda: (
            replicas_by_node(deployed, [head, replacement]) == {head.name: 1, replacement.name: 1}
        ),
        180,
    )
    await asyncio.to_thread(wait_for, "the app to be healthy", deployed.healthy, 60)
    async with httpx.AsyncClient() as client:
        after = await one_request(client, deployed.url, SPREAD_MODEL, 8, CLIENT_TIMEOUT_S)
    assert after.ok, after
