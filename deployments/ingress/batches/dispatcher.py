"""Runs batches: claims one from the store, sends its unanswered lines as batch-class
requests through the ingress's own path, records each answer, and finalizes the files.

Any ingress replica may dispatch; the store's lease says which one runs a batch. The lease
is renewed on a heartbeat; a dispatcher that dies stops renewing and, once the lease runs
out, another one (or the same replica restarted) claims the batch and runs only the lines
with no recorded answer. A line's answer is recorded before it counts as done, so after
any crash every line is answered exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from deployments.config import BatchesConfig
from deployments.core.batch_jobs.lines import (
    BatchLine,
    LineFailure,
    answered_line,
    failed_line,
    line_id,
    read_lines,
    request_lines,
)
from deployments.core.batch_jobs.pacing import Others, Pace
from deployments.core.batch_jobs.records import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    EXPIRED,
    FAILED,
    FINALIZING,
    IN_PROGRESS,
    VALIDATING,
    BatchRecord,
)
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.ingress.batches.finalize import write_results
from deployments.ingress.batches.store import BatchStore

logger = logging.getLogger("ray.serve")

# Refusals that say "later", not "never": the line waits and is sent again.
RETRY_STATUSES = frozenset({429, 503, 504})


@dataclass(frozen=True)
class LineAnswer:
    status: int
    body: bytes  # the answer's JSON
    retry_after_s: float | None = None


class LineRunner(Protocol):
    async def run(self, endpoint: str, body: bytes, tenant: str, request_id: str) -> LineAnswer:
        """One line as a batch-class request of `tenant`; every failure is an answer."""
        ...

    def admitted_lines(self) -> int:
        """The most batch-class requests the server admits at once: more in flight would
        only be refused."""
        ...

    def others(self, endpoint: str) -> Others:
        """Whether realtime or normal work waits for (queued) or runs on (active) the
        endpoint's models."""
        ...


class Dispatcher:
    def __init__(
        self,
        store: BatchStore,
        runner: LineRunner,
        config: BatchesConfig,
        metrics: TributaryMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.runner = runner
        self.config = config
        self.metrics = metrics or TributaryMetrics()
        self.clock = clock
        self.owner = uuid.uuid4().hex
        self.waiting = 0  # lines of the running batch not yet answered (for /status)
        self.running: str | None = None

    async def run_forever(self) -> None:
        while True:
            try:
                worked = await self.run_once()
            except Exception:
                logger.exception("batch dispatcher: a pass failed; trying again")
                worked = False
            if not worked:
                await asyncio.sleep(self.config.poll_s)

    async def run_once(self) -> bool:
        """Claims and runs one batch; False when there was none to run."""
        record = await self.store.claim(self.owner, self.config.lease_s)
        if record is None:
            return False
        run = BatchRun(self, record)
        self.running = record.id
        try:
            await run.run()
        finally:
            self.running, self.waiting = None, 0
            await self.store.release(record.id, self.owner)
        return True


class BatchRun:
    """One dispatcher's turn at one batch, from its claim to its end or its lost lease."""

    def __init__(self, dispatcher: Dispatcher, record: BatchRecord) -> None:
        self.d = dispatcher
        self.record = record
        self.stop: str | None = None  # cancelling / expired / lost / error

    async def run(self) -> None:
        # The heartbeat spans the whole turn: finalizing a large batch takes a while.
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            if self.record.status == VALIDATING and not await self._validate():
                return
            if self.record.status == IN_PROGRESS:
                await self._dispatch()
            if self.stop == "lost":
                return
            fresh = await self.d.store.get_batch(self.record.id)
            if fresh is not None:
                self.record = fresh
                await self._finish()
        finally:
            heartbeat.cancel()
            # gather, not `suppress(CancelledError)`: a cancel of this task that lands
            # while it waits for the heartbeat must still end it.
            await asyncio.gather(heartbeat, return_exceptions=True)

    async def _validate(self) -> bool:
        record = self.record
        found = await self.d.store.get_file(record.input_file_id)
        if found is None or not self.d.store.files.path(found.id).exists():
            await self._fail(VALIDATING)
            return False
        record.move_to(IN_PROGRESS, int(self.d.clock()))
        return await self.d.store.save(record, {VALIDATING})

    async def _fail(self, expect: str) -> None:
        record = self.record
        record.errors = [
            {
                "code": "input_file_missing",
                "message": "The input file was deleted before every line had run.",
                "param": "input_file_id",
                "line": None,
            }
        ]
        record.move_to(FAILED, int(self.d.clock()))
        if await self.d.store.save(record, {expect}):
            self._observe_end()

    def _lines(self) -> list[BatchLine | LineFailure]:
        data = self.d.store.files.path(self.record.input_file_id).read_bytes()
        return list(read_lines(request_lines(data), self.record.endpoint))

    async def _dispatch(self) -> None:
        record, store = self.record, self.d.store
        done = await store.answered(record.id)
        try:
            lines = await asyncio.to_thread(self._lines)
        except FileNotFoundError:  # deleted while the batch ran: nothing left to send
            await self._fail(IN_PROGRESS)
            return
        pending: deque[BatchLine] = deque()
        for line in lines:
            if line.number in done:
                continue
            if isinstance(line, LineFailure):
                text = failed_line(record.id, line.number, line.custom_id, line.code, line.message)
                await self._record(line.number, False, text)
            else:
                pending.append(line)
        pace = Pace(min(self.d.config.max_in_flight_lines, self.d.runner.admitted_lines()))
        in_flight: set[asyncio.Task[None]] = set()
        # Woken by each line that ends: waiting on every task at once (asyncio.wait) costs a
        # callback per task per wake-up, which with hundreds in flight ate the ingress's CPU.
        wake = asyncio.Event()

        def ended(task: asyncio.Task[None]) -> None:
            in_flight.discard(task)
            wake.set()
            if not task.cancelled() and task.exception() is not None:
                # The store refused an answer: stop here; the next claim runs what is left.
                logger.error("batch %s: a line failed", record.id, exc_info=task.exception())
                self.stop = self.stop or "error"

        try:
            while (pending or in_flight) and self.stop is None:
                self.d.waiting = len(pending) + len(in_flight)
                self.d.metrics.batch_lines_waiting(self.d.waiting)
                if self.d.clock() >= record.expires_at:
                    self.stop = EXPIRED
                    break
                now = time.monotonic()
                others = self.d.runner.others(record.endpoint)
                while pending and pace.may_start(len(in_flight), now, others):
                    task = asyncio.create_task(self._send(pending.popleft(), pace, pending))
                    in_flight.add(task)
                    task.add_done_callback(ended)
                wake.clear()
                # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancel that
                # lands as the awaited event is set, and then `stop` would wait forever.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.05):
                        await wake.wait()
            if self.stop != "lost" and in_flight:
                await asyncio.wait(in_flight)  # their answers are kept, not thrown away
        finally:
            for task in list(in_flight):
                task.cancel()
            self.d.metrics.batch_lines_waiting(0)

    async def _send(self, line: BatchLine, pace: Pace, pending: deque[BatchLine]) -> None:
        request_id = line_id(self.record.id, line.number)
        answer = await self.d.runner.run(
            self.record.endpoint, line.body, self.record.tenant, request_id
        )
        if answer.status in RETRY_STATUSES:
            pace.refused(time.monotonic(), answer.retry_after_s or 1.0)
            pending.appendleft(line)
            self.d.metrics.batch_lines("refused", 1)
            return
        pace.succeeded()
        ok = 200 <= answer.status < 300
        text = answered_line(
            self.record.id, line.number, line.custom_id, answer.status, request_id, answer.body
        )
        await self._record(line.number, ok, text)

    async def _record(self, number: int, ok: bool, text: bytes) -> None:
        if await self.d.store.record(self.record.id, number, ok, text):
            self.d.metrics.batch_lines("completed" if ok else "failed", 1)

    async def _heartbeat(self) -> None:
        store, config = self.d.store, self.d.config
        while True:
            await asyncio.sleep(config.lease_s / 3)
            if not await store.renew(self.record.id, self.d.owner, config.lease_s):
                logger.warning("batch %s: lease lost; another dispatcher has it", self.record.id)
                self.stop = "lost"
                return
            fresh = await store.get_batch(self.record.id)
            if fresh is not None and fresh.status == CANCELLING:
                self.stop = CANCELLING

    async def _finish(self) -> None:
        """Writes the output and error files once every line is answered or the batch
        stops (cancelled, expired): lines never answered go to the error file."""
        record, store, now = self.record, self.d.store, int(self.d.clock())
        if record.status == CANCELLING:
            end = CANCELLED
        elif record.status in (IN_PROGRESS, FINALIZING):
            if record.completed + record.failed >= record.total:
                end = COMPLETED
            elif self.stop == EXPIRED or now >= record.expires_at:
                end = EXPIRED
            else:
                return  # stopped early (shutdown): the next claim goes on
            if record.status == IN_PROGRESS:
                record.move_to(FINALIZING, now)
                if not await store.save(record, {IN_PROGRESS}):
                    return  # cancelled meanwhile: the next claim finishes it as cancelled
        else:
            return
        if end in (EXPIRED, CANCELLED):
            await self._fail_unanswered(end)
        out_id, err_id, completed, failed = await write_results(store, record)
        record.output_file_id, record.error_file_id = out_id, err_id
        record.completed, record.failed = completed, failed
        record.move_to(end, int(self.d.clock()))
        if await store.save(record, {FINALIZING, CANCELLING}):
            self._observe_end()

    async def _fail_unanswered(self, end: str) -> None:
        record = self.record
        done = await self.d.store.answered(record.id)
        code = "batch_expired" if end == EXPIRED else "batch_cancelled"
        message = (
            "The batch's completion window ended before this request ran."
            if end == EXPIRED
            else "The batch was cancelled before this request ran."
        )
        try:
            lines = await asyncio.to_thread(self._lines)
        except FileNotFoundError:  # deleted before the batch ever started
            lines = []
        for line in lines:
            if line.number not in done:
                text = failed_line(record.id, line.number, line.custom_id, code, message)
                await self._record(line.number, False, text)

    def _observe_end(self) -> None:
        self.d.metrics.batch_finished(self.record.status, self.d.clock() - self.record.created_at)
