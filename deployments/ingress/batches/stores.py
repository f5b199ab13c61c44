"""The store the config names: SQLite and a local directory, or Redis and a shared path."""

from __future__ import annotations

import os
from pathlib import Path

from deployments.config import BatchesConfig
from deployments.ingress.batches.store import BatchStore


def default_root() -> Path:
    # Read when the app builds, never at import: the Ray process's own environment.
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "tributary" / "batches"


def build_store(config: BatchesConfig) -> BatchStore:
    root = Path(config.path).expanduser() if config.path else default_root()
    root.mkdir(parents=True, exist_ok=True)
    if config.store == "redis":
        from deployments.ingress.batches.redis_store import RedisBatchStore

        assert config.url is not None  # the config's validator requires it
        return RedisBatchStore(config.url, root)
    from deployments.ingress.batches.sqlite_store import SqliteStore

    return SqliteStore(root)
