"""A batch line as an ordinary batch-class request of the ingress: the same parse,
tenant checks, admission, result cache, versions and coalescing as one sent over HTTP."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import orjson

from deployments.core.access.access import Tenant
from deployments.core.batch_jobs.pacing import Others
from deployments.core.priority import Priority
from deployments.errors import InternalError, TributaryError, Unauthorized
from deployments.ingress.api.dialects import (
    COHERE_RERANK,
    JINA_RERANK,
    OPENAI_CHAT,
    OPENAI_COMPLETIONS,
    OPENAI_EMBEDDINGS,
    Dialect,
)
from deployments.ingress.api.request_meta import RequestMeta
from deployments.ingress.api.schemas import to_json
from deployments.ingress.batches.dispatcher import LineAnswer

if TYPE_CHECKING:
    from deployments.ingress.ingress import Ingress

logger = logging.getLogger("ray.serve")

# The endpoints a batch may name, each with its route's dialect: its task's queues tell
# whether higher classes wait.
ENDPOINTS: dict[str, Dialect] = {
    "/v1/embeddings": OPENAI_EMBEDDINGS,
    "/v1/chat/completions": OPENAI_CHAT,
    "/v1/completions": OPENAI_COMPLETIONS,
    "/v1/rerank": COHERE_RERANK,
    "/v2/rerank": JINA_RERANK,
}
# No tenant: access is open (no keys configured); batches are then everyone's.
OPEN_TENANT = ""


class IngressLines:
    def __init__(self, ingress: Ingress) -> None:
        self.ingress = ingress

    async def run(self, endpoint: str, body: bytes, tenant: str, request_id: str) -> LineAnswer:
        dialect = ENDPOINTS[endpoint]
        meta = RequestMeta(
            request_id=request_id, priority=Priority.BATCH, timeout_s=None, authorization=None
        )
        try:
            answer = await self.ingress.answer(dialect, body, meta, self._tenant(tenant))
        except TributaryError as exc:
            return LineAnswer(exc.status, orjson.dumps(exc.body()), exc.retry_after_s)
        except Exception:
            logger.exception("batch line %s failed in the ingress", request_id)
            return LineAnswer(500, orjson.dumps(InternalError().body()))
        return LineAnswer(200, to_json(answer.body))

    def _tenant(self, name: str) -> Tenant | None:
        gate = self.ingress.gate
        if gate.is_open:
            return None
        tenant = gate.tenant_named(name)
        if tenant is None:  # its keys were removed since: it may no longer use the server
            raise Unauthorized(f"The batch's tenant {name!r} is no longer configured.")
        return tenant

    def admitted_lines(self) -> int:
        # A line is at least one item; the batch class's bounds are in items.
        batch = self.ingress.config.ingress.admission.batch
        return min(batch.max_queued_items, batch.shed_above_queued_items or batch.max_queued_items)

    def others(self, endpoint: str) -> Others:
        task = ENDPOINTS[endpoint].task
        seen: Others = "idle"
        for _, version in self.ingress.catalog.versions_of_task(task):
            if version.client is None:
                continue  # generation: its replica's slots order the classes
            for priority in (Priority.REALTIME, Priority.NORMAL):
                queued, running = version.client.queues.load(priority)
                if queued:
                    return "queued"
                if running:
                    seen = "active"
        return seen
