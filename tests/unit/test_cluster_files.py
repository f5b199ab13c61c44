"""The cluster profile stays the application of serve_config.yaml, and the deployment files
around it stay valid: Serve's own schema for both Serve configs, the app's typed args, the
JSON schema inside `ray` for the launcher config, and the generated files up to date."""

from __future__ import annotations

import copy
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray
import yaml
from packaging.specifiers import SpecifierSet
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.serve.schema import ServeDeploySchema

from cluster import render
from deployments.config import AppConfig

ROOT = render.ROOT
SERVE_CONFIGS = [ROOT / "serve_config.yaml", ROOT / "serve_config.gpu.yaml"]
# What the GPU profile may change in a deployment's options; everything else in `args` must
# equal serve_config.yaml.
RESOURCE_KEYS = {"num_replicas", "autoscaling_config", "ray_actor_options"}


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def model_entries(app: dict[str, Any]) -> list[dict[str, Any]]:
    """Every model of every kind (embedding_models and later ones): list entries of `args`
    that carry their own deployment options."""
    return [
        entry
        for value in app["args"].values()
        if isinstance(value, list)
        for entry in value
        if isinstance(entry, dict) and "deployment" in entry
    ]


def without_resources(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The applications with what the GPU profile may change taken out."""
    apps = copy.deepcopy(config["applications"])
    for app in apps:
        # Whether an ingress replica is kept for realtime is how the ingress's replicas
        # are used, as their number is.
        app["args"]["ingress"].pop("realtime_replica", None)
        for owner in [app["args"]["ingress"], *model_entries(app)]:
            owner.pop("dtype", None)
            owner.pop("standby_replicas", None)  # a fixed count's; autoscaling has none
            for key in RESOURCE_KEYS:
                owner["deployment"].pop(key, None)
    return apps


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=lambda p: p.name)
def test_serve_config_validates_against_serve_deploy_schema(path: Path) -> None:
    ServeDeploySchema.model_validate(load(path))


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=lambda p: p.name)
def test_app_args_validate_as_app_config(path: Path) -> None:
    for app in load(path)["applications"]:
        AppConfig.model_validate(app["args"])


def test_gpu_profile_is_the_same_application_apart_from_resources() -> None:
    cpu, gpu = (load(path) for path in SERVE_CONFIGS)
    assert without_resources(gpu) == without_resources(cpu)
    # Around the applications, only the address the proxies listen on may differ.
    for config in (cpu, gpu):
        config.pop("applications")
        config["http_options"].pop("host")
    assert gpu == cpu


def test_every_gpu_model_deployment_claims_a_gpu_fraction_and_autoscales() -> None:
    config = load(ROOT / "serve_config.gpu.yaml")
    assert config["http_options"]["host"] == "0.0.0.0"  # reachable from a load balancer
    for app in config["applications"]:
        models = model_entries(app)
        assert models
        for model in models:
            deployment = model["deployment"]
            assert 0 < deployment["ray_actor_options"]["num_gpus"] <= 1, model["name"]
            assert "num_replicas" not in deployment, model["name"]
            scaling = deployment["autoscaling_config"]
            assert 1 <= scaling["min_replicas"] < scaling["max_replicas"], model["name"]
            # Up quickly, down slowly: a GPU node takes minutes to come back.
            assert scaling["upscale_delay_s"] < scaling["downscale_delay_s"], model["name"]
            assert model.get("dtype", "auto") == "auto", model["name"]
        for model in app["args"].get("embedding_models", []):
            assert model["deployment"]["ray_actor_options"]["num_gpus"] < 1  # shares a card


def test_generated_files_are_up_to_date() -> None:
    stale = [
        str(path.relative_to(ROOT))
        for path, text in render.rendered().items()
        if not path.exists() or path.read_text() != text
    ]
    assert not stale, f"{stale} are stale: run `python -m cluster.render`"


def test_overlay_merges_into_every_list_element_and_removes_nulls() -> None:
    base = {"a": [{"x": 1, "keep": True}, {"x": 2}], "b": {"n": 1, "gone": 3}, "c": [1]}
    patch = {"a": {"x": 9, "y": {"z": 1}}, "b": {"gone": None}, "c": [2]}
    assert render.overlay(base, patch) == {
        "a": [{"x": 9, "keep": True, "y": {"z": 1}}, {"x": 9, "y": {"z": 1}}],
        "b": {"n": 1},
        "c": [2],
    }
    assert base["b"] == {"n": 1, "gone": 3}  # inputs untouched


def pinned_ray() -> SpecifierSet:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [d for d in dependencies if re.match(r"ray(\[[^]]*\])?[<>=!~]", d)]
    return SpecifierSet(re.sub(r"^ray(\[[^]]*\])?", "", spec))


def test_rayservice_carries_the_gpu_profile_and_a_gpu_worker_group() -> None:
    service = load(ROOT / "cluster" / "rayservice.yaml")
    assert (service["apiVersion"], service["kind"]) == ("ray.io/v1", "RayService")
    spec = service["spec"]
    assert yaml.safe_load(spec["serveConfigV2"]) == load(ROOT / "serve_config.gpu.yaml")
    cluster = spec["rayClusterConfig"]
    version = cluster["rayVersion"]
    assert version == ray.__version__ and version in pinned_ray()
    assert cluster["enableInTreeAutoscaling"] is True
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    images = [c["image"] for c in head["template"]["spec"]["containers"]]
    (group,) = cluster["workerGroupSpecs"]
    assert 1 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    assert group["minReplicas"] < group["maxReplicas"]
    for container in group["template"]["spec"]["containers"]:
        images.append(container["image"])
        resources = container["resources"]
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"]
        assert int(resources["limits"]["nvidia.com/gpu"]) >= 1
    # The image is cluster/Dockerfile's, built on Ray's image of the same version.
    assert all(f"-ray{version}-" in image for image in images), images
    dockerfile = (ROOT / "cluster" / "Dockerfile").read_text()
    assert f"FROM rayproject/ray:{version}-py311-gpu" in dockerfile


def test_launcher_config_validates_against_the_schema_inside_ray() -> None:
    config = load(ROOT / "cluster" / "ray-cluster.yaml")
    schema_path = Path(ray.autoscaler.__file__).with_name("ray-schema.json")
    jsonschema.validate(config, json.loads(schema_path.read_text()))
    # What `ray up` itself checks, once it has filled in the provider's defaults.
    validate_config(prepare_config(copy.deepcopy(config)))

    assert config["docker"]["image"] == f"rayproject/ray:{ray.__version__}-py311-gpu"
    assert ray.__version__ in pinned_ray()
    head = config["available_node_types"][config["head_node_type"]]
    assert head["resources"] == {"CPU": 0}
    gpu_types = [
        node for node in config["available_node_types"].values() if node["resources"].get("GPU")
    ]
    assert gpu_types and all(0 <= node["min_workers"] < node["max_workers"] for node in gpu_types)
    assert any("pip install" in c and "tributary" in c for c in config["setup_commands"])
    assert any("serve deploy serve_config.gpu.yaml" in c for c in config["head_start_ray_commands"])
    assert any("--num-cpus=0" in c for c in config["head_start_ray_commands"])
