"""One two-node Ray cluster on this machine for the whole folder, with Tributary deployed
on it by `serve deploy`, as on a real cluster.

Nodes: a head (the GCS, the Serve controller, the HTTP proxy, the ingress) and a worker.
Custom resources place replicas: every node offers one `tributary_model_slot`, and the
spread model's two replicas each claim one, so one runs on each node; the head alone offers
`tributary_head`, which pins the ingress (and the autoscaling model) to the node that stays.
The proxy runs on the head only (proxy_location HeadOnly): two proxies on one machine
would want the same port, and the head is what a load balancer would keep reaching. The
app runs behind Serve's own proxy, not HAProxy + direct ingress (`make serve`'s default):
that is what `serve deploy` gives on any cluster, and it needs no HAProxy on the nodes.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from bench.server import load_config
from tests.cluster.local_cluster import LocalCluster, Node, unique_free_port, wait_for

APP = "tributary"
HEAD = "tributary_head"
SLOT = "tributary_model_slot"
HELD_TARGET_MS = 600_000  # the batch class's timeout_s: only the deadline bounds it
SPREAD_MODEL = "minilm-spread"  # 2 replicas, one per node
SCALING_MODEL = "minilm-autoscale"  # autoscales between 1 and 2 replicas on the head
WORKER_CPUS = 1


def cluster_test_config(http_port: int) -> dict[str, Any]:
    """serve_config.yaml with two copies of its model and small CPU claims, so that the
    replicas fit two nodes sharing 2 cores; placement through Serve's per-deployment
    overrides (`deployments:`), which take `resources` where the app's args do not."""
    config = load_config()
    config["proxy_location"] = "HeadOnly"
    config["http_options"] = {**config.get("http_options", {}), "port": http_port}
    app = config["applications"][0]
    args = app["args"]
    # The node-loss test holds batch-class requests on chosen replicas for longer than any
    # target (held_batch.py): admission must take a second one while the first runs.
    args["ingress"]["admission"]["batch"]["target_ms"] = HELD_TARGET_MS
    # One ingress, pinned to the head: behind Serve's own proxy no replica is kept for
    # realtime (that is HAProxy's rule), and the head has room for one.
    args["ingress"]["realtime_replica"] = False
    args["ingress"]["deployment"]["num_replicas"] = 1
    base = args["embedding_models"][0]
    spread = copy.deepcopy(base)
    spread.update(name=SPREAD_MODEL, torch_threads=1)
    spread["deployment"]["num_replicas"] = 2
    scaling = copy.deepcopy(base)
    scaling.update(name=SCALING_MODEL, torch_threads=1)
    scaling["deployment"].pop("num_replicas", None)
    scaling["deployment"]["autoscaling_config"] = {
        "min_replicas": 1,
        "max_replicas": 2,
        # Higher than the calls the ingress ever keeps open to a model (two per class): the
        # queue alone never asks, so a second replica shows the busy share asked for it.
        "target_ongoing_requests": 16,
        # Seconds, not minutes, so the test sees both directions quickly.
        "upscale_delay_s": 1,
        "downscale_delay_s": 4,
        "metrics_interval_s": 0.5,
        "look_back_period_s": 2,
    }
    args["embedding_models"] = [spread, scaling]
    # Only the models under test: other kinds (rerank_models, ...) would add replicas that
    # prove nothing here and that 2 cores can ill afford.
    for key in [k for k, v in args.items() if k != "embedding_models" and is_model_list(v)]:
        del args[key]

    def placed(resources: dict[str, float], num_cpus: float) -> dict[str, Any]:
        return {"ray_actor_options": {"num_cpus": num_cpus, "resources": resources}}

    app["deployments"] = [
        {"name": "ingress", **placed({HEAD: 0.01}, 0.25)},
        {"name": f"embed-{SPREAD_MODEL}", **placed({SLOT: 1}, 0.5)},
        {"name": f"embed-{SCALING_MODEL}", **placed({HEAD: 0.01}, 0.5)},
    ]
    return config


def is_model_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(entry, dict) and "deployment" in entry for entry in value
    )


@dataclass
class DeployedCluster:
    cluster: LocalCluster
    url: str

    @property
    def head(self) -> Node:
        return self.cluster.nodes[0]

    def add_worker(self) -> Node:
        number = len(self.cluster.nodes)
        return self.cluster.start_node(f"worker-{number}", WORKER_CPUS, {SLOT: 1})

    def healthy(self) -> bool:
        return httpx.get(f"{self.url}/healthz", timeout=5).status_code == 200


@pytest.fixture(scope="package")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DeployedCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"))
    try:
        # The head's logical CPUs: ingress 0.25 + one spread replica 0.5 + up to two
        # autoscaled replicas 0.5 each, with room to spare.
        cluster.start_node("head", 3, {HEAD: 1, SLOT: 1})
        cluster.start_node("worker-1", WORKER_CPUS, {SLOT: 1})
        port = unique_free_port()
        cluster.deploy(cluster_test_config(port))
        deployed = DeployedCluster(cluster, f"http://127.0.0.1:{port}")
        wait_for("the app to be healthy", deployed.healthy, timeout_s=240)
        yield deployed
    finally:
        leftovers = cluster.stop()
    if leftovers:
        raise RuntimeError(f"Ray processes outlived the cluster: {sorted(leftovers)}")
