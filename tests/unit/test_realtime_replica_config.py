"""`ingress.realtime_replica`: the config asks for it only with company, and the launcher
tells HAProxy's wrapper which apps asked (deployments/launch/realtime_front.py)."""

import pytest
from pydantic import ValidationError

from deployments.config import AppConfig
from deployments.launch.realtime_front import (
    REALTIME_INGRESS,
    realtime_environment,
    realtime_ingress_apps,
)
from tests.unit.test_config import default_args


def test_the_shipped_config_keeps_a_replica_for_realtime_beside_another() -> None:
    ingress = AppConfig.model_validate(default_args()).ingress
    assert ingress.realtime_replica and ingress.deployment.num_replicas == 2


@pytest.mark.parametrize(
    "deployment",
    [{"num_replicas": 1}, {}, {"autoscaling_config": {"min_replicas": 1, "max_replicas": 4}}],
)
def test_a_realtime_replica_needs_at_least_two(deployment: dict) -> None:
    args = default_args()
    args["ingress"]["deployment"] = deployment
    with pytest.raises(ValidationError, match="at least 2 replicas"):
        AppConfig.model_validate(args)
    args["ingress"]["realtime_replica"] = False
    AppConfig.model_validate(args)


def test_an_autoscaled_ingress_of_two_or_more_may_keep_one() -> None:
    args = default_args()
    args["ingress"]["deployment"] = {"autoscaling_config": {"min_replicas": 2, "max_replicas": 4}}
    assert AppConfig.model_validate(args).ingress.realtime_replica


def test_the_launcher_names_the_apps_that_ask() -> None:
    def app(name: str, realtime: bool | None, builder: str = "deployments.app:build_app") -> dict:
        args = default_args()
        if realtime is None:
            args["ingress"].pop("realtime_replica", None)
        else:
            args["ingress"]["realtime_replica"] = realtime
        return {"name": name, "import_path": builder, "args": args}

    config = {
        "applications": [
            app("tributary", True),
            app("quiet", False),
            app("unsaid", None),
            app("model", True, "deployments.app:build_model_app"),
        ]
    }
    assert realtime_ingress_apps(config) == ["tributary"]
    assert realtime_environment(config) == {REALTIME_INGRESS: "tributary"}
    assert realtime_environment({"applications": [app("quiet", False)]}) == {}
    assert realtime_environment({}) == {}
    # Args its build will refuse (one replica cannot keep one for realtime): not named.
    lonely = app("lonely", True)
    lonely["args"]["ingress"]["deployment"] = {"num_replicas": 1}
    assert realtime_environment({"applications": [lonely]}) == {}
    # Not a Serve config at all: Serve says so later; nothing to tell HAProxy meanwhile.
    for odd in ({"applications": "x"}, {"applications": [1, {"args": []}]}):
        assert realtime_environment(odd) == {}
