"""The Serve config the launcher was given, read once, and the parts of it the launcher's
own checks look at (placement.py, realtime_front.py): its applications, and the validated
args of each that deployments/app.py builds. A file that is YAML but not a Serve config reads
as one with no applications: `serve run` says what is wrong with it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from deployments.config import AppConfig

# The builders whose deployments are known from their args (deployments/app.py).
APP_BUILDER = "deployments.app:build_app"
MODEL_APP_BUILDER = "deployments.app:build_model_app"


class ConfigFileError(ValueError):
    """The file cannot be read, or is not YAML."""


def load_config(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"cannot read {path}: {exc}") from exc
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"{path} is not YAML: {exc}") from exc
    return loaded if isinstance(loaded, dict) else {}


def applications(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    listed = config.get("applications")
    if not isinstance(listed, list):
        return []
    return [application for application in listed if isinstance(application, Mapping)]


def app_name(application: Mapping[str, Any]) -> str:
    return str(application.get("name", "default"))


def built_app_config(application: Mapping[str, Any]) -> AppConfig | None:
    """The args of an application deployments.app:build_app builds, validated; None for
    another builder, or args that do not validate (its build will say why)."""
    if application.get("import_path") != APP_BUILDER:
        return None
    try:
        return AppConfig.model_validate(application.get("args") or {})
    except ValidationError:
        return None
