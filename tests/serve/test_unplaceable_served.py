"""A config the machine cannot place (issue 31): `python -m deployments.launch` says why and
exits with status 3 instead of waiting forever, both when the sum of what the config asks is
already too much (refused before anything is deployed) and when only Serve finds out
(replicas waiting "to be scheduled", given up after --placement-timeout-s). The second run
also shows where HAProxy's files live while it runs and that a clean stop removes them."""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path

import pytest

from bench.server import Server, alive, descendants, launch, load_config
from deployments.launch import main as launch_module
from deployments.launch.paths import INSTANCE_DIR_VARIABLE
from deployments.launch.placement import EXIT_UNPLACEABLE

# Every replica of the test config asks for more than the whole machine: none is placed,
# so nothing loads a model and the run stays short.
CPUS = os.cpu_count() or 1
GIVE_UP_S = 3
# Serve says a replica is slow to be scheduled after 30 s, and repeats it each 30 s.
SERVE_SAYS_EARLY = {
    "RAY_SERVE_SLOW_STARTUP_WARNING_S": "1",
    "RAY_SERVE_SLOW_STARTUP_WARNING_PERIOD_S": "1",
}


def two_embedder_versions() -> dict:
    """The issue's config: a second version of the embedder beside the first. Its num_cpus
    (the machine's CPU count) makes the sum too much on any machine; on the 2-core one it
    is the issue's own 1."""
    config = load_config()
    models = config["applications"][0]["args"]["embedding_models"]
    second = copy.deepcopy(models[0])
    second["version"] = "2"
    second["deployment"]["ray_actor_options"]["num_cpus"] = CPUS - 1 if CPUS > 2 else 1
    models.append(second)
    return config


def nothing_fits() -> dict:
    config = load_config()
    args = config["applications"][0]["args"]
    for key in ("rerank_models", "generation_models"):
        args.pop(key)
    # One replica of each, so the sum is the two claims.
    args["ingress"]["realtime_replica"] = False
    args["ingress"]["deployment"]["num_replicas"] = 1
    for deployment in (args["ingress"]["deployment"], args["embedding_models"][0]["deployment"]):
        deployment["ray_actor_options"]["num_cpus"] = CPUS + 1
    return config


def own_side_ports() -> dict[str, str]:
    """HAProxy's side ports and Serve's fallback ports, chosen here: the launcher moves a
    taken default, but two servers starting in the same seconds (other tests, other users)
    can both find one free and the later HAProxy then fails to bind it."""
    ports: set[int] = set()
    while len(ports) < len(launch_module.HAPROXY_SIDE_PORTS):
        ports.add(launch_module.spare_port())
    names = launch_module.HAPROXY_SIDE_PORTS
    return {name: str(port) for name, port in zip(names, ports, strict=True)}


def instance_dirs(pids: set[int]) -> set[Path]:
    """The launcher's instance directory, as the processes it started inherited it."""
    found = set()
    for pid in pids:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        prefix = f"{INSTANCE_DIR_VARIABLE}=".encode()
        found |= {Path(item[len(prefix) :].decode()) for item in environ if item.startswith(prefix)}
    return found


def wait_for_exit(server: Server, timeout_s: float) -> tuple[set[Path], set[Path]]:
    """Waits for the launcher to exit by itself and for every process it started to end;
    its instance directories and the HAProxy configs seen in them meanwhile."""
    started: set[int] = set()
    instances: set[Path] = set()
    configs: set[Path] = set()
    deadline = time.monotonic() + timeout_s
    while server.process.poll() is None and time.monotonic() < deadline:
        started |= descendants(server.process.pid)
        instances |= instance_dirs(started)
        for instance in instances:
            configs |= set(instance.glob("*/haproxy*.cfg"))
        time.sleep(0.5)
    if server.process.poll() is None:
        server.process.kill()
        server.process.wait()
        pytest.fail(f"the launcher was still waiting after {timeout_s} s:\n{server.log_tail()}")
    settle = time.monotonic() + 30
    while alive(started) and time.monotonic() < settle:
        time.sleep(0.2)
    assert not alive(started), f"processes outlived the launcher: {sorted(alive(started))}"
    return instances, configs


def output_once_exited(server: Server, status: int, timeout_s: float) -> str:
    """What the launcher printed, once it has exited by itself with `status`."""
    wait_for_exit(server, timeout_s)
    output = server.log.read_text()
    assert server.process.returncode == status, output
    return output


def test_a_config_that_can_never_fit_is_refused_before_deploying(tmp_path: Path) -> None:
    started = time.monotonic()
    server = launch(two_embedder_versions(), tmp_path, [])
    output = output_once_exited(server, EXIT_UNPLACEABLE, timeout_s=120)
    assert "the config asks for more CPU than this Ray has" in output
    assert "embedding model all-MiniLM-L6-v2@2" in output
    assert "CPU: the config asks" in output
    assert "Deploying app" not in output  # nothing reached Serve
    print(f"refused in {time.monotonic() - started:.1f} s")


def test_replicas_serve_cannot_schedule_end_the_launch_with_serves_reason(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    server = launch(
        nothing_fits(),
        tmp_path,
        ["--no-placement-check", f"--placement-timeout-s={GIVE_UP_S}"],
        environment={**SERVE_SAYS_EARLY, **own_side_ports()},
    )
    instances, configs = wait_for_exit(server, timeout_s=150)
    output = server.log.read_text()
    assert server.process.returncode == EXIT_UNPLACEABLE, output
    assert f"the launcher gives up if that lasts {GIVE_UP_S} s" in output
    assert "giving up. Serve says:" in output
    assert "to be scheduled" in output and "Resources required for each replica" in output
    assert f"CPU: the config asks {2 * (CPUS + 1)}, this Ray has" in output
    # HAProxy ran on a config in this instance's own directory, which the stop removed.
    (instance,) = instances
    assert instance.parent.name == f"tributary-{os.geteuid()}"
    assert configs and all(config.is_relative_to(instance) for config in configs)
    assert not instance.exists()
    print(f"gave up in {time.monotonic() - started:.1f} s")
