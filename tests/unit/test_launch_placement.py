"""deployments.launch.placement: the launcher adds up what a config asks against what the Ray
it started has and refuses one that can never fit, and while the app starts it gives up,
with Serve's reason, once a deployment has waited the bound for room. Served:
tests/serve/test_unplaceable_served.py."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

from bench.server import load_config
from deployments.launch.placement import (
    EXIT_UNPLACEABLE,
    MIB,
    PlacementCheck,
    StuckClock,
    config_demands,
    placement_problem,
    unscheduled,
)
from deployments.launch.start_watch import StartWatch

TWO_CORES = {"CPU": 2.0, "memory": 4096.0 * MIB}
SERVE_SAYS = (
    "Deployment 'ingress' in application 'tributary' has 1 replicas that have taken more "
    'than 30s to be scheduled. ... Resources required for each replica: {"CPU": 0.5}, '
    "total resources available: {}. Use `ray status` for more details."
)


def two_embedder_versions() -> dict[str, Any]:
    """The issue's config: a second version of the embedder, at num_cpus 1 like the first."""
    config = load_config()
    models = config["applications"][0]["args"]["embedding_models"]
    models.append({**copy.deepcopy(models[0]), "version": "2"})
    return config


def test_the_shipped_config_fits_two_cores() -> None:
    assert placement_problem(load_config(), TWO_CORES) is None


def test_two_embedder_versions_on_two_cores_are_refused_with_the_arithmetic() -> None:
    problem = placement_problem(two_embedder_versions(), TWO_CORES)
    assert problem is not None
    lines = problem.splitlines()
    assert lines[0].startswith("the config asks for more CPU than this Ray has")
    assert "  CPU: the config asks 3, this Ray has 2" in lines
    assert any(
        "embedding model all-MiniLM-L6-v2@2" in line and "1 x CPU 1" in line for line in lines
    )
    assert any("tributary: ingress" in line and "2 x CPU 0.25" in line for line in lines)
    assert any("generation model tiny-llama-demo" in line and "x nothing" in line for line in lines)
    assert "ray_actor_options" in lines[-1]


def test_replicas_autoscaling_gpus_and_memory_are_counted() -> None:
    config = load_config()
    embedder = config["applications"][0]["args"]["embedding_models"][0]["deployment"]
    embedder.pop("num_replicas")
    embedder["autoscaling_config"] = {"min_replicas": 1, "max_replicas": 8, "initial_replicas": 3}
    embedder["ray_actor_options"] = {"num_cpus": 0.25, "num_gpus": 0.5, "memory": 512 * MIB}
    (demand, *_) = [d for d in config_demands(config)[0] if "embedding" in d.label]
    assert demand.replicas == 3
    problem = placement_problem(config, {"CPU": 16.0, "memory": 1024.0 * MIB})
    assert problem is not None
    assert problem.startswith("the config asks for more GPU and memory than")
    assert "  GPU: the config asks 1.5, this Ray has 0" in problem
    assert "  memory: the config asks 1,536 MiB, this Ray has 1,024 MiB" in problem


def test_applications_it_cannot_read_are_left_to_serve() -> None:
    config = two_embedder_versions()
    other = {"name": "other", "import_path": "somewhere:app", "args": {}}
    overridden = {**config["applications"][0], "deployments": [{"name": "ingress"}]}
    config["applications"] = [overridden, other]
    assert config_demands(config) == ([], ["tributary", "other"])
    assert placement_problem(config, TWO_CORES) is None


def _status(app_status: str, **messages: str) -> SimpleNamespace:
    deployments = {name: SimpleNamespace(message=text) for name, text in messages.items()}
    app = SimpleNamespace(status=app_status, deployments=deployments)
    return SimpleNamespace(applications={"tributary": app})


def test_only_deployments_waiting_for_room_count_as_stuck() -> None:
    slow_load = "has 1 replicas that have taken more than 30s to initialize."
    status = _status("DEPLOYING", ingress=SERVE_SAYS, embed=slow_load, rerank="")
    assert unscheduled(status) == {"tributary/ingress": SERVE_SAYS}
    assert unscheduled(SimpleNamespace(applications={})) == {}


def test_the_clock_runs_only_while_stuck_without_a_break() -> None:
    clock = StuckClock(timeout_s=10)
    assert not clock.expired(True, now=0)
    assert not clock.expired(False, now=9)  # placed meanwhile: starts over
    assert not clock.expired(True, now=12)
    assert clock.expired(True, now=22)
    assert not StuckClock(timeout_s=0).expired(True, now=1e9)  # 0 waits forever


def _watch(statuses: list[SimpleNamespace], said: list[str], stops: list[bool]) -> StartWatch:
    answers = iter(statuses)
    check = PlacementCheck(two_embedder_versions(), lambda: TWO_CORES, timeout_s=0.05)
    return StartWatch(
        status=lambda: next(answers, statuses[-1]),
        checks=[check],
        say=said.append,
        give_up=lambda: stops.append(True),
        poll_s=0.01,
    )


def test_the_watch_gives_up_with_serves_reason_and_the_arithmetic() -> None:
    said: list[str] = []
    stops: list[bool] = []
    watch = _watch([_status("DEPLOYING", ingress=SERVE_SAYS)], said, stops)
    watch.run()
    assert stops == [True] and watch.stopped_by is not None
    assert watch.stopped_by.exit_status == EXIT_UNPLACEABLE
    first, last = said[0], said[-1]
    assert first.startswith("Serve cannot place every replica yet; the launcher gives up if")
    assert SERVE_SAYS in first
    assert last.startswith("Serve could not place every replica for 0 s; giving up.")
    assert SERVE_SAYS in last
    assert "  CPU: the config asks 3, this Ray has 2" in last.splitlines()


def test_the_watch_ends_quietly_once_the_apps_run() -> None:
    said: list[str] = []
    stops: list[bool] = []
    starting = [_status("DEPLOYING", ingress=""), _status("DEPLOYING", ingress=SERVE_SAYS)]
    watch = _watch([*starting, _status("RUNNING", ingress="")], said, stops)
    watch.run()
    assert stops == [] and watch.stopped_by is None
    assert len(said) == 1  # the notice, then nothing
