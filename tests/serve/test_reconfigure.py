"""Batch knobs change at runtime: `serve deploy` of the same config with a `user_config`
override for a model deployment reconfigures its running replica in place (same process),
and requests keep being served. (Changing `args` instead rebuilds the application and
restarts its replicas: Serve's heavyweight update.)"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import yaml

from bench.server import deploy
from tests.serve.conftest import AUTH, STRICT_MODEL, Server


def replica_info(server: Server) -> dict:
    return httpx.get(f"{server.url}/v1/stats", timeout=10).json()["models"][STRICT_MODEL]["replica"]


def test_serve_deploy_changes_batching_without_restarting_the_replica(
    server: Server, tmp_path: Path
) -> None:
    before = replica_info(server)
    config = yaml.safe_load(server.config_path.read_text())
    batching = yaml.safe_load(yaml.safe_dump(before["batching"]))
    batching["normal"].update(max_batch_size=8, batch_wait_timeout_s=0.002, max_batch_tokens=2048)
    batching["realtime"]["target_p99_ms"] = 40.0
    batching["batch"]["max_batch_tokens"] = 16384  # the target, not this ceiling, binds
    config["applications"][0]["deployments"] = [
        {"name": f"embed-{STRICT_MODEL}", "user_config": batching}
    ]
    deploy(server, config, tmp_path / "reconfigured.yaml")

    deadline = time.monotonic() + 90
    after = replica_info(server)
    while after["batching"]["normal"]["max_batch_size"] != 8 and time.monotonic() < deadline:
        time.sleep(1)
        after = replica_info(server)
    assert after["batching"] == batching
    assert after["pid"] == before["pid"]  # reconfigured, not restarted
    response = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"model": STRICT_MODEL, "input": [f"text {i}" for i in range(20)]},
        headers=AUTH,
        timeout=60,
    )
    assert response.status_code == 200 and len(response.json()["data"]) == 20

    # The new realtime target bounds every class's passes once the replica has a cost fit.
    for i in range(10):
        one = {"model": STRICT_MODEL, "input": f"one text {i}"}
        assert httpx.post(f"{server.url}/v1/embeddings", json=one, headers=AUTH).status_code == 200
    tuned = replica_info(server)
    assert tuned["cost_model"]["samples"] >= 8
    assert tuned["targets"]["realtime"]["slot_ms"] > 0
    batch_plan = tuned["plans"]["batch"]
    assert "slot" in batch_plan["why"]
    assert batch_plan["max_batch_tokens"] < batching["batch"]["max_batch_tokens"]
