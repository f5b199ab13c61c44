"""deployments.launch.config_file: the launcher reads its Serve config once, and its checks
see only the applications and validated args that can be known; the replica counts they
reason with come from DeploymentOptions."""

from __future__ import annotations

from pathlib import Path

import pytest

from deployments.config.serve_options import DeploymentOptions
from deployments.launch.config_file import (
    ConfigFileError,
    applications,
    built_app_config,
    load_config,
)
from deployments.launch.main import main as launch
from tests.unit.test_config import default_args


def test_a_file_that_is_not_yaml_is_named_with_the_parser_s_reason(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("applications: [\n")
    with pytest.raises(ConfigFileError, match=r"broken\.yaml is not YAML"):
        load_config(broken)


def test_a_file_that_is_not_text_is_named(tmp_path: Path) -> None:
    binary = tmp_path / "weights.yaml"
    binary.write_bytes(b"\xff\xfe\x00\x80")
    with pytest.raises(ConfigFileError, match=r"cannot read .*weights\.yaml"):
        load_config(binary)


def test_the_launcher_refuses_a_file_that_is_not_yaml_before_starting_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("applications: {\n")
    with pytest.raises(SystemExit) as stopped:
        launch([str(broken)])
    assert stopped.value.code == 2
    assert "broken.yaml is not YAML" in capsys.readouterr().err


def test_yaml_that_is_not_a_mapping_has_no_applications(tmp_path: Path) -> None:
    listed = tmp_path / "listed.yaml"
    listed.write_text("- 1\n- 2\n")
    assert load_config(listed) == {}
    assert applications({"applications": "x"}) == []
    assert applications({"applications": [1, {"name": "a"}]}) == [{"name": "a"}]


def test_only_build_app_args_that_validate_are_read() -> None:
    good = {"import_path": "deployments.app:build_app", "args": default_args()}
    built = built_app_config(good)
    assert built is not None and built.ingress.realtime_replica
    assert built_app_config({**good, "import_path": "deployments.app:build_model_app"}) is None
    assert built_app_config({**good, "args": {"ingress": {"nonsense": 1}}}) is None


@pytest.mark.parametrize(
    ("options", "fewest", "starting"),
    [
        ({}, 1, 1),
        ({"num_replicas": 3}, 3, 3),
        ({"autoscaling_config": {"min_replicas": 2, "max_replicas": 8}}, 2, 2),
        (
            {"autoscaling_config": {"min_replicas": 0, "max_replicas": 8, "initial_replicas": 4}},
            0,
            4,
        ),
    ],
)
def test_replica_counts(options: dict, fewest: int, starting: int) -> None:
    deployment = DeploymentOptions.model_validate(options)
    assert (deployment.fewest_replicas, deployment.starting_replicas) == (fewest, starting)
