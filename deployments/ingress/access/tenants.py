"""Build the ingress's access control from `auth:` in the config, reading key sources."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from deployments.config import AuthConfig, TenantConfig
from deployments.core.access.access import AccessControl, Tenant
from deployments.core.access.keys import KeyRing, digest
from deployments.core.access.token_bucket import TokenBucket
from deployments.core.priority import Priority

logger = logging.getLogger("ray.serve")


class KeySourceError(ValueError):
    pass


def build_access_control(
    auth: AuthConfig, environ: Mapping[str, str] | None = None
) -> AccessControl:
    environ = os.environ if environ is None else environ
    entries: list[tuple[str, Tenant]] = []
    for config in auth.tenants:
        tenant = _tenant_of(config)
        digests = _digests_of(config, environ)
        if not digests:
            raise KeySourceError(f"tenant {config.name!r}: its key sources hold no key")
        entries.extend((d, tenant) for d in digests)
    return AccessControl(KeyRing(entries))


def _tenant_of(config: TenantConfig) -> Tenant:
    return Tenant(
        name=config.name,
        tier=Priority.parse(config.tier),
        models=frozenset(config.models) if config.models is not None else None,
        requests=_bucket(config.requests_per_s, config.burst_requests),
        tokens=_bucket(config.tokens_per_s, config.burst_tokens),
    )


def _bucket(rate: float | None, burst: float | None) -> TokenBucket | None:
    if rate is None:
        return None
    return TokenBucket(rate, burst if burst is not None else max(1.0, 2 * rate))


def _digests_of(config: TenantConfig, environ: Mapping[str, str]) -> list[str]:
    digests = [d.lower() for d in config.key_sha256]
    if config.key_env is not None:
        value = environ.get(config.key_env)
        if value is None:
            raise KeySourceError(
                f"tenant {config.name!r}: environment variable {config.key_env} is not set "
                "in the Ray processes (set it where `ray start` / `serve run` runs)"
            )
        digests += [digest(k.strip()) for k in value.split(",") if k.strip()]
    if config.key_file is not None:
        path = Path(config.key_file).expanduser()
        try:
            lines = path.read_text().splitlines()
        except OSError as exc:
            raise KeySourceError(f"tenant {config.name!r}: cannot read {path}: {exc}") from None
        for line in (raw.strip() for raw in lines):
            if not line or line.startswith("#"):
                continue
            if not line.startswith("sha256:"):
                digests.append(digest(line))
                continue
            stored = line[7:].strip().lower()
            if len(stored) != 64 or any(c not in "0123456789abcdef" for c in stored):
                raise KeySourceError(
                    f"tenant {config.name!r}: {path} has a sha256: line that is not a "
                    "64-digit hex digest"
                )
            digests.append(stored)
    return digests
