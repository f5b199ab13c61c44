"""Which apps keep one ingress replica for realtime requests. Serve's HAProxy, through
deployments/bin/haproxy_front_door.py, reads the answer from TRIBUTARY_REALTIME_INGRESS,
which it inherits from the Ray this launcher starts; the app's own `ingress.realtime_replica`
is where an operator says it (docs/operations.md, "A replica for realtime")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deployments.launch.config_file import app_name, applications, built_app_config

REALTIME_INGRESS = "TRIBUTARY_REALTIME_INGRESS"


def realtime_ingress_apps(config: Mapping[str, Any]) -> list[str]:
    """The names of the config's apps whose ingress asks for a realtime replica."""
    names: list[str] = []
    for application in applications(config):
        built = built_app_config(application)
        if built is not None and built.ingress.realtime_replica:
            names.append(app_name(application))
    return names


def realtime_environment(config: Mapping[str, Any]) -> dict[str, str]:
    """The variable for HAProxy's wrapper; empty when no app asks, so an operator's own
    setting is left alone."""
    names = realtime_ingress_apps(config)
    return {REALTIME_INGRESS: ",".join(names)} if names else {}
