"""The Batch API's operations for one caller: files and batches of its tenant, within
the limits, in OpenAI's shapes. The routes (http/batches.py) only read and answer."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import IO, Any

from deployments.config import BatchesConfig
from deployments.core.access.access import Tenant
from deployments.core.batch_jobs.records import (
    CANCELLING,
    IN_PROGRESS,
    VALIDATING,
    WINDOWS_S,
    BatchRecord,
    FileRecord,
    new_batch_id,
    new_file_id,
)
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.errors import (
    Conflict,
    InvalidRequest,
    ObjectNotFound,
    PayloadTooLarge,
    RateLimited,
)
from deployments.ingress.batches.dispatcher import Dispatcher, LineRunner
from deployments.ingress.batches.line_runner import OPEN_TENANT
from deployments.ingress.batches.schemas import parse_create_batch
from deployments.ingress.batches.store import BatchStore
from deployments.ingress.batches.upload import copy_lines

logger = logging.getLogger("ray.serve")

# How long `stop` waits for the dispatcher to end before cancelling it again.
STOP_RECHECK_S = 0.5


class BatchService:
    def __init__(
        self,
        config: BatchesConfig,
        open_store: Callable[[], BatchStore],
        runner: LineRunner,
        metrics: TributaryMetrics | None = None,
    ) -> None:
        self.config = config
        self._open_store = open_store
        self._runner = runner
        self._metrics = metrics
        self._store: BatchStore | None = None
        self._dispatcher: Dispatcher | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def store(self) -> BatchStore:
        # Opened on first use: an app that never sees a batch creates no files.
        if self._store is None:
            self._store = self._open_store()
        return self._store

    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            self._dispatcher = Dispatcher(self.store, self._runner, self.config, self._metrics)
        return self._dispatcher

    def start(self) -> None:
        """Starts dispatching (resuming any batch a dead dispatcher left); idempotent."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.dispatcher.run_forever())

    async def stop(self) -> None:
        task = self._task
        # Cancelled until it ends: a cancel that a library swallows (one that lands as an
        # awaited result arrives) must not leave the replica's shutdown waiting forever.
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_RECHECK_S)
        if task is not None and not task.cancelled() and task.exception() is not None:
            logger.error("batch dispatcher ended with an error", exc_info=task.exception())
        if self._store is not None:
            await self._store.close()

    # Files.
    async def upload(
        self, tenant: Tenant | None, filename: str, purpose: str, source: IO[bytes]
    ) -> dict[str, Any]:
        if purpose != "batch":
            raise InvalidRequest("'purpose' must be 'batch'.", param="purpose")
        file_id = new_file_id()
        area = self.store.files
        with area.writer() as sink:
            try:
                size, lines = await asyncio.to_thread(copy_lines, source, sink, self.config)
            except (PayloadTooLarge, InvalidRequest):
                sink.close()
                area.discard(sink.name)
                raise
        area.commit(sink.name, file_id)
        record = FileRecord(
            id=file_id,
            tenant=_owner(tenant),
            filename=filename[:256] or "input.jsonl",
            purpose=purpose,
            size=size,
            created_at=int(time.time()),
            lines=lines,
        )
        await self.store.put_file(record)
        return record.to_openai()

    async def file(self, tenant: Tenant | None, file_id: str) -> FileRecord:
        record = await self.store.get_file(file_id)
        if record is None or record.tenant != _owner(tenant):
            raise ObjectNotFound(f"No such File object: {file_id[:100]}", param="file_id")
        return record

    async def delete_file(self, tenant: Tenant | None, file_id: str) -> dict[str, Any]:
        record = await self.file(tenant, file_id)
        await self.store.delete_file(record.id)
        self.store.files.remove(record.id)
        return {"id": record.id, "object": "file", "deleted": True}

    # Batches.
    async def create(self, tenant: Tenant | None, body: bytes) -> dict[str, Any]:
        request = parse_create_batch(body)
        source = await self.file(tenant, request.input_file_id)
        if source.purpose != "batch":
            raise InvalidRequest(
                "The input file must be one uploaded with purpose 'batch'.", param="input_file_id"
            )
        if source.lines == 0:
            raise InvalidRequest("The input file has no request lines.", param="input_file_id")
        if source.lines > self.config.max_lines_per_batch:
            raise InvalidRequest(
                f"The input file has {source.lines} request lines; a batch takes at most "
                f"{self.config.max_lines_per_batch}. Split it into several batches.",
                param="input_file_id",
                code="too_many_lines",
            )
        owner = _owner(tenant)
        if await self.store.open_batches(owner) >= self.config.max_open_batches:
            raise RateLimited(
                f"This tenant has {self.config.max_open_batches} batches not yet finished, the "
                "most it may have; wait for one to finish or cancel one.",
                code="too_many_open_batches",
            )
        now = int(time.time())
        record = BatchRecord(
            id=new_batch_id(),
            tenant=owner,
            endpoint=request.endpoint,
            input_file_id=source.id,
            completion_window=request.completion_window,
            created_at=now,
            expires_at=now + WINDOWS_S[request.completion_window],
            total=source.lines,
            metadata=request.metadata,
        )
        await self.store.create_batch(record)
        return record.to_openai()

    async def batch(self, tenant: Tenant | None, batch_id: str) -> BatchRecord:
        record = await self.store.get_batch(batch_id)
        if record is None or record.tenant != _owner(tenant):
            raise ObjectNotFound(f"No such Batch object: {batch_id[:100]}", param="batch_id")
        return record

    async def list(self, tenant: Tenant | None, after: str | None, limit: int) -> dict[str, Any]:
        records = await self.store.list_batches(_owner(tenant), after, limit + 1)
        data = [r.to_openai() for r in records[:limit]]
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": len(records) > limit,
        }

    async def cancel(self, tenant: Tenant | None, batch_id: str) -> dict[str, Any]:
        record = await self.batch(tenant, batch_id)
        if record.status == CANCELLING:
            return record.to_openai()
        if record.status not in (VALIDATING, IN_PROGRESS):
            raise Conflict(
                f"A batch with status '{record.status}' cannot be cancelled.",
                code="batch_not_cancellable",
            )
        record.move_to(CANCELLING, int(time.time()))
        if not await self.store.save(record, {VALIDATING, IN_PROGRESS}):
            return (await self.batch(tenant, batch_id)).to_openai()  # it moved on meanwhile
        return record.to_openai()

    async def summary(self) -> dict[str, Any]:
        """What this replica's dispatcher is doing, for /v1/stats and /status."""
        d = self._dispatcher
        running = None
        if d is not None and d.running is not None:
            record = await self.store.get_batch(d.running)
            if record is not None:
                counts = {"total": record.total, "completed": record.completed}
                running = {
                    "id": record.id,
                    "endpoint": record.endpoint,
                    "status": record.status,
                    **counts,
                    "failed": record.failed,
                    "created_at": record.created_at,
                }
        return {
            "pid": os.getpid(),  # the process that dispatches (tests kill it)
            "running": running,
            "lines_waiting": 0 if d is None else d.waiting,
        }


def _owner(tenant: Tenant | None) -> str:
    return OPEN_TENANT if tenant is None else tenant.name
