"""Who may call, which models, how fast: API key -> tenant -> tier, models, rate limits."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from deployments.core.access.keys import KeyRing
from deployments.core.access.token_bucket import TokenBucket
from deployments.core.priority import Priority


@dataclass
class Tenant:
    name: str
    tier: Priority  # the highest class it gets
    models: frozenset[str] | None  # None = every model
    requests: TokenBucket | None = None
    tokens: TokenBucket | None = None


class AccessDenied(Exception):
    """`kind`: missing_key | invalid_key | model_not_allowed | rate_limited."""

    def __init__(self, kind: str, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.retry_after_s = retry_after_s


class AccessControl:
    def __init__(self, keys: KeyRing[Tenant]) -> None:
        self._keys = keys

    @property
    def is_open(self) -> bool:
        """No keys configured: anyone may call (local use)."""
        return not self._keys

    def authenticate(self, authorization: str | None) -> Tenant | None:
        """The tenant of a `Bearer <key>` header; None when access is open."""
        if self.is_open:
            return None
        if not authorization:
            raise AccessDenied(
                "missing_key", "No API key: send the header 'Authorization: Bearer <key>'."
            )
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise AccessDenied("invalid_key", "The Authorization header must be 'Bearer <key>'.")
        tenant = self._keys.owner_of(key.strip())
        if tenant is None:
            raise AccessDenied("invalid_key", "The API key is not valid.")
        return tenant

    def tenant_named(self, name: str) -> Tenant | None:
        """The tenant called `name` (work it left behind, a batch job, runs as it); None
        when no configured tenant has that name any more."""
        return next((t for t in self._keys.owners() if t.name == name), None)

    @staticmethod
    def authorize(tenant: Tenant | None, model: str) -> None:
        if tenant is not None and tenant.models is not None and model not in tenant.models:
            raise AccessDenied(
                "model_not_allowed", f"This API key may not use the model '{model}'."
            )

    @staticmethod
    def charge(tenant: Tenant | None, tokens: int) -> None:
        """Takes one request and `tokens` (an estimate) from the tenant's buckets, or
        raises rate_limited with the wait that would let it through."""
        if tenant is None:
            return
        waits = [
            bucket.wait_for(amount)
            for bucket, amount in ((tenant.requests, 1), (tenant.tokens, tokens))
            if bucket is not None
        ]
        wait = max(waits, default=0.0)
        if wait > 0:
            raise AccessDenied(
                "rate_limited",
                f"Rate limit of tenant '{tenant.name}' reached; retry in {math.ceil(wait)} s.",
                retry_after_s=wait,
            )
        if tenant.requests is not None:
            tenant.requests.take(1)
        if tenant.tokens is not None:
            tenant.tokens.take(tokens)

    @classmethod
    def hold(cls, tenant: Tenant | None, tokens: int) -> Charge:
        """`charge`, as a `Charge` to settle once the model has counted."""
        cls.charge(tenant, tokens)
        return Charge(tenant, tokens)

    @staticmethod
    def settle(tenant: Tenant | None, estimated: int, actual: int) -> None:
        """Replaces the estimate charged at admission by the model's own count."""
        if tenant is not None and tenant.tokens is not None:
            tenant.tokens.give_back(estimated - actual)


@dataclass
class Charge:
    """One request's tokens, taken from its tenant at admission as an estimate and settled
    once with the model's own count. Every task charges this way: embeddings and rerank
    settle with the outcome's token counts, generation with the last chunk's usage."""

    tenant: Tenant | None
    estimate: int
    settled: bool = False

    def settle(self, actual: int) -> None:
        if not self.settled:
            self.settled = True
            AccessControl.settle(self.tenant, self.estimate, actual)

    @contextmanager
    def refunded_on_failure(self) -> Iterator[None]:
        """A failure (or cancellation) in the block settles at 0: tokens the model never
        computed are not charged."""
        try:
            yield
        except BaseException:
            self.settle(0)
            raise


def estimate_tokens(texts: list[str]) -> int:
    """A cheap upper-ish estimate before tokenizing: ~4 characters a token, plus the
    model's special tokens; corrected by `settle` once the model has counted."""
    return sum(len(text) // 4 + 3 for text in texts)
