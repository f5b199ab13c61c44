"""Who may call: the ingress's one door for keys, model permissions and token budgets.

Every refusal leaves as its HTTP error (401, 403 or 429 with `Retry-After`) and is counted
by kind for `/v1/stats`; the pipeline never sees an `AccessDenied`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import ray

from deployments.config import AuthConfig
from deployments.core.access.access import AccessDenied, Charge, Tenant
from deployments.errors import Forbidden, RateLimited, TributaryError, Unauthorized
from deployments.ingress.access.tenants import build_access_control

T = TypeVar("T")

logger = logging.getLogger("ray.serve")


class AccessGate:
    def __init__(self, auth: AuthConfig) -> None:
        self._control = build_access_control(auth)
        self._denied: dict[str, int] = {}

    @property
    def is_open(self) -> bool:
        """No keys configured: every caller is let in, untracked."""
        return self._control.is_open

    def authenticate(self, authorization: str | None) -> Tenant | None:
        return self._checked(lambda: self._control.authenticate(authorization))

    def authorize(self, tenant: Tenant | None, model: str) -> None:
        self._checked(lambda: self._control.authorize(tenant, model))

    def hold(self, tenant: Tenant | None, estimate: int) -> Charge:
        """Takes `estimate` tokens from the tenant's budget until the charge settles."""
        return self._checked(lambda: self._control.hold(tenant, estimate))

    def tenant_named(self, name: str) -> Tenant | None:
        """The tenant configured under `name` (a batch's owner), None if no longer."""
        return self._control.tenant_named(name)

    def denied(self) -> dict[str, int]:
        return dict(self._denied)

    def warn_if_open_to_the_network(self) -> None:
        host = _http_host()
        if self.is_open and host is not None and host not in ("127.0.0.1", "localhost", "::1"):
            logger.warning(
                "No API keys are configured and the HTTP server listens on %s: anyone who can "
                "reach it can use every model. Add tenants under auth: in the config "
                "(docs/api.md, 'API keys').",
                host,
            )

    def _checked(self, check: Callable[[], T]) -> T:
        try:
            return check()
        except AccessDenied as exc:
            self._denied[exc.kind] = self._denied.get(exc.kind, 0) + 1
            raise access_error(exc) from None


def access_error(exc: AccessDenied) -> TributaryError:
    if exc.kind in ("missing_key", "invalid_key"):
        return Unauthorized(exc.message)
    if exc.kind == "model_not_allowed":
        return Forbidden(exc.message, param="model")
    return RateLimited(exc.message, retry_after_s=exc.retry_after_s)


def _http_host() -> str | None:
    # Serve keeps the HTTP options with its controller; there is no public getter.
    try:
        from ray.serve.context import _get_global_client

        if not ray.is_initialized():
            return None  # not in a replica (tests, benchmarks): asking would start a Ray

        client = _get_global_client()
        return None if client is None else str(client.http_config.host)
    except Exception:
        return None
