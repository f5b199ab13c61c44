"""The ingress's half of refusing at the front door (core/admission/front_shedding.py has
the why): which requests share a key, what HAProxy said it applied, and the headers that
carry the share back. `bin/haproxy_front_door.py` writes HAProxy's half from the same names
(tests/parts/test_front_door_shedding.py checks that they agree)."""

from __future__ import annotations

from starlette.responses import Response
from starlette.types import Scope

from deployments.core.admission.front_shedding import FrontShedding

# Response headers the ingress sets and HAProxy removes after reading them.
SHARE_HEADER = "x-tributary-shed"
RETRY_HEADER = "x-tributary-shed-retry"
# The share HAProxy applied to this request, set by HAProxy (a client's own is dropped).
APPLIED_HEADER = b"x-tributary-front-shed"
PRIORITY_HEADER = b"x-priority"

# Route families HAProxy tells apart by path alone (it does not read bodies, so the model
# is not part of the key).
FAMILIES: dict[str, frozenset[str]] = {
    "embed": frozenset({"/v1/embeddings", "/v1/embed", "/v2/embed", "/embed", "/"}),
    "rerank": frozenset({"/v1/rerank", "/v2/rerank", "/rerank"}),
}
# The X-Priority values shed at the front; "none" is a request without the header.
# Realtime is not: its own admission is its only judge, as before.
SHED_CLASSES = ("normal", "batch", "none")

_FAMILY_OF = {path: family for family, paths in FAMILIES.items() for path in paths}


class FrontDoorShares:
    def __init__(self, shedding: FrontShedding) -> None:
        self.shedding = shedding

    @staticmethod
    def key_of(scope: Scope) -> tuple[str, int] | None:
        """This request's key and the share HAProxy applied to it, or None when it is not
        one HAProxy sheds."""
        family = _FAMILY_OF.get(scope["path"])
        if family is None:
            return None
        priority, applied = "none", 0
        for name, value in scope["headers"]:
            if name == PRIORITY_HEADER:
                priority = value.decode("latin-1").strip().lower()
            elif name == APPLIED_HEADER and value.isdigit():
                applied = int(value)
        if priority not in SHED_CLASSES:
            return None
        return f"{family}_{priority}", applied

    def stamp(
        self, response: Response, key: str, applied: int, refused_retry_after_s: int | None
    ) -> None:
        advice = self.shedding.observe(key, applied, refused_retry_after_s)
        response.headers[SHARE_HEADER] = str(advice.permille)
        response.headers[RETRY_HEADER] = str(advice.retry_after_s)
