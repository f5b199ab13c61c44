"""Where model weights come from: a Python package that ships them, or a local directory.

No machine this project targets can reach a model hub, so hub ids are not accepted: a
source that is neither a package nor an existing directory is a configuration error.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

PACKAGE_PREFIX = "package:"


def default_cache_dir() -> Path:
    """Where built models, exported graphs and kept measurements live between runs."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tributary"


class ModelSourceError(ValueError):
    pass


def resolve_model_source(source: str) -> Path:
    """The local directory holding the weights named by `source`."""
    if source.startswith(PACKAGE_PREFIX):
        return _package_model_dir(source.removeprefix(PACKAGE_PREFIX))
    path = Path(source).expanduser()
    if not path.is_dir():
        raise ModelSourceError(
            f"model source {source!r} is not a directory; use a local path or "
            f"'{PACKAGE_PREFIX}<module>' for weights shipped in a Python package"
        )
    return path.resolve()


def _package_model_dir(module_name: str) -> Path:
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelSourceError(f"model package {module_name!r} is not installed ({exc})") from exc
    get_model_path = getattr(module, "get_model_path", None)
    path = Path(get_model_path()) if callable(get_model_path) else _module_dir(module) / "model"
    if not path.is_dir():
        raise ModelSourceError(f"package {module_name!r} has no model directory at {path}")
    return path


def _module_dir(module: object) -> Path:
    return Path(str(getattr(module, "__file__", ""))).parent
