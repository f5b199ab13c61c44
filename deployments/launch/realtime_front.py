"""Which apps keep one ingress replica for realtime requests. Serve's HAProxy, through
deployments/bin/haproxy_front_door.py, reads the answer from TRIBUTARY_REALTIME_INGRESS,
which it inherits from the Ray this launcher starts; the app's own `ingress.realtime_replica`
is where an operator says it (docs/operations.md, "A replica for realtime")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deployments.launch.placement import APP_BUILDER

REALTIME_INGRESS = "TRIBUTARY_REALTIME_INGRESS"


def realtime_ingress_apps(config: Mapping[str, Any]) -> list[str]:
    """The names of the config's apps whose ingress asks for a realtime replica. The raw
    config is read, not validated: an app whose args are wrong fails at its build anyway."""
    names: list[str] = []
    applications = config.get("applications") if isinstance(config, Mapping) else None
    for application in applications if isinstance(applications, list) else []:
        if not isinstance(application, Mapping) or application.get("import_path") != APP_BUILDER:
            continue
        args = application.get("args")
        ingress = args.get("ingress") if isinstance(args, Mapping) else None
        if isinstance(ingress, Mapping) and ingress.get("realtime_replica") is True:
            names.append(str(application.get("name", "default")))
    return names


def realtime_environment(config: Mapping[str, Any]) -> dict[str, str]:
    """The variable for HAProxy's wrapper; empty when no app asks, so an operator's own
    setting is left alone."""
    names = realtime_ingress_apps(config)
    return {REALTIME_INGRESS: ",".join(names)} if names else {}
