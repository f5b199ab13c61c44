"""The ingress's side of one model deployment: per-class queues, calls, and notes.

Requests are queued by priority class (`ClassQueues`: admission, then a coalescer per
class) and leave as one call per group to the deployment, a `JobCall` through its handle
(`core/protocol.py`'s `BatchedHandle`, the same for every batched task). Serve's and Ray's
own failures are turned into the API's errors here, and jobs whose client left after their
call went out are named to the model (`forget`) so it drops them before computing.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from ray.serve.exceptions import BackPressureError

from deployments.config import AdmissionConfig
from deployments.core.admission.admission import ClassLimits, Refusal
from deployments.core.admission.class_queues import (
    ClassQueues,
    ClassSettings,
    Refused,
    loop_deadline,
)
from deployments.core.admission.coalescer import CallInterrupted, DeadlineExpired, Send
from deployments.core.admission.job_work import work_of
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.priority import ALL_PRIORITIES, Priority
from deployments.core.protocol import BatchedHandle, BatchJob, JobCall
from deployments.errors import DeadlineExceeded, NotReady, Overloaded
from deployments.ingress.calls.call_errors import RAY_CALL_ERRORS, ray_call_error
from deployments.ingress.calls.observe import request_started

logger = logging.getLogger("ray.serve")

JobT = TypeVar("JobT", bound=BatchJob)
OutcomeT = TypeVar("OutcomeT")

# How long a request waits for the replica to say its vectors' width (once per version);
# past it the request goes on and its `dimensions` is checked against the result instead.
WIDTH_TIMEOUT_S = 5.0
# How often the replica's capacity (its cost model's full-pass rate) is asked again while
# requests come: it moves with the runtime's warm-up and the mix of lengths, not faster.
CAPACITY_REFRESH_S = 5.0
# How long after admission refused a request of a class its calls say it is shedding.
SHEDDING_MEMORY_S = 1.0


class ModelClient(Generic[JobT, OutcomeT]):
    def __init__(
        self,
        name: str,
        handle: BatchedHandle[JobT, OutcomeT],
        admission: AdmissionConfig,
        max_group_items: int,
        metrics: TributaryMetrics | None = None,
        model_targets_ms: Mapping[Priority, float | None] | None = None,
        window_tokens: int | None = None,
    ) -> None:
        """`model_targets_ms`: the model's own latency targets per class (its batching's
        `target_p99_ms`), which take the place of the admission's where given.
        `window_tokens`: the most the model reads of one input, where the config says."""
        self.name = name
        self._metrics = metrics
        self._handle = handle
        self._notes: set[asyncio.Task[Any]] = set()
        self._width: int | None = None
        self._width_asked = False
        # Only the prediction reads the capacity: with it off, no replica is asked.
        self._asks_capacity = admission.predict_wait
        self._capacity_due = 0.0
        self._capacity_asking = False
        targets = model_targets_ms or {}
        settings = {
            p: ClassSettings(
                ClassLimits(
                    admission.of(p.label).max_queued_items,
                    admission.of(p.label).shed_above_queued_items,
                ),
                admission.of(p.label).max_in_flight,
                (targets.get(p) or admission.target_ms(p.label)) / 1e3,
            )
            for p in ALL_PRIORITIES
        }
        self._targets_s = {p: one.target_s for p, one in settings.items()}
        self._refused_at = dict.fromkeys(ALL_PRIORITIES, -math.inf)
        self.queues: ClassQueues[JobT, OutcomeT] = ClassQueues(
            self._sender,
            settings,
            size_of=len,
            work_of=work_of(window_tokens),
            max_group_items=max_group_items,
            on_abandon=self._forget,
            predict_wait=admission.predict_wait,
        )

    def _sender(self, priority: Priority) -> Send[JobT, OutcomeT]:
        async def send(
            jobs: list[JobT], time_left: list[float | None], spent: list[float]
        ) -> list[OutcomeT]:
            shedding = time.monotonic() - self._refused_at[priority] < SHEDDING_MEMORY_S
            call = JobCall(priority, jobs, time_left, spent, self._targets_s[priority], shedding)
            response = self._handle.remote(call)
            try:
                return await response
            except asyncio.CancelledError:
                # Every client of this call left. Serve cancels it in the replica, but under
                # load its cancel can arrive after the replica's next forward pass; the note
                # travels as a plain call and whichever lands first drops the jobs.
                response.cancel()
                self._forget_all([job.job_id for job in jobs])
                raise
            except RAY_CALL_ERRORS as exc:
                if not isinstance(exc, BackPressureError):
                    logger.warning("model %s replica unavailable: %r", self.name, exc)
                raise ray_call_error(self.name, priority, exc) from exc

        return send

    def _forget(self, job: JobT) -> None:
        # Its call carries other clients' jobs, so it goes on; the model is told to skip
        # this one. With several replicas the note may reach another one, which ignores
        # it: the job is then computed and its answer discarded.
        self._forget_all([job.job_id])

    def _forget_all(self, job_ids: list[str]) -> None:
        note = asyncio.get_running_loop().create_task(self._send_forget(job_ids))
        self._notes.add(note)
        note.add_done_callback(self._notes.discard)

    async def _send_forget(self, job_ids: list[str]) -> None:
        try:
            await self._handle.forget.remote(job_ids)
        except Exception as exc:  # a lost note costs one wasted computation, no more
            logger.info("could not tell model %s to drop jobs: %r", self.name, exc)

    async def submit(self, priority: Priority, job: JobT, timeout_s: float) -> OutcomeT:
        """Queues a job in its class and waits for its outcome; a refusal or a deadline
        that passed becomes the API's error."""
        try:
            self._report_depth(priority)
            if self._asks_capacity:
                self._refresh_capacity()
            return await self.queues.submit(
                priority, job, loop_deadline(timeout_s), since=request_started()
            )
        except Refused as exc:
            self._refused_at[priority] = time.monotonic()
            raise overloaded(self.name, priority, exc.refusal) from None
        except CallInterrupted:
            raise NotReady(
                f"The call to model '{self.name}' was interrupted (a replica restarting or "
                "leaving); retry shortly."
            ) from None
        except DeadlineExpired:
            raise DeadlineExceeded(
                f"No answer within the request's deadline of {timeout_s:g} s "
                "(X-Request-Timeout or the class default)."
            ) from None
        finally:
            # Set as requests come and go: no timer to run, and fresh whenever it moves.
            self._report_depth(priority)

    def _report_depth(self, priority: Priority) -> None:
        if self._metrics is not None:
            depth = self.queues.queued_items()[priority]
            self._metrics.queue_depth(self.name, priority.label, depth)

    async def info(self) -> dict[str, Any]:
        return await self._handle.info.remote()

    def _refresh_capacity(self) -> None:
        """Asks the replica for its capacity in the background, at most every few seconds:
        the admission's prediction divides queued work by it (`WaitPredictor`)."""
        now = time.monotonic()
        if self._capacity_asking or now < self._capacity_due:
            return
        self._capacity_due = now + CAPACITY_REFRESH_S
        self._capacity_asking = True
        task = asyncio.get_running_loop().create_task(self._ask_capacity())
        self._notes.add(task)
        task.add_done_callback(self._notes.discard)

    async def _ask_capacity(self) -> None:
        try:
            info = await asyncio.wait_for(self.info(), WIDTH_TIMEOUT_S)
            capacity = info.get("capacity_rows_per_s")
            if isinstance(capacity, int | float):
                self.queues.predictor.set_capacity(float(capacity))
        except Exception as exc:  # the measured rate alone serves until the next ask
            logger.debug("could not ask model %s its capacity: %r", self.name, exc)
        finally:
            self._capacity_asking = False

    async def output_width(self) -> int | None:
        """How many components the model's vectors have, as its replica reports them: asked
        once and kept (a version's weights do not change under a running ingress). None
        when the replica reports none (a reranker) or cannot be asked now."""
        if not self._width_asked:
            try:
                info = await asyncio.wait_for(self.info(), WIDTH_TIMEOUT_S)
            except Exception as exc:  # asked again by the next request that needs it
                logger.info("could not ask model %s its output width: %r", self.name, exc)
                return None
            width = info.get("dimension")
            self._width = width if isinstance(width, int) else None
            self._width_asked = True
        return self._width


def overloaded(model: str, priority: Priority, refusal: Refusal) -> Overloaded:
    """A refusal of admission as the API's 429/503 with Retry-After."""
    label = priority.label
    if refusal.reason == "wait":
        why = (
            f"Model '{model}' expects to answer {label}-class requests in "
            f"{refusal.predicted_ms:g} ms (~{refusal.queued_items} tokens ahead), over the "
            f"{refusal.limit} ms left of their target or deadline"
        )
    elif refusal.reason == "held":
        why = (
            f"This server holds {refusal.queued_items} requests, its bound for {label}-class "
            f"ones is {refusal.limit}"
        )
    else:
        verb = "is shedding" if refusal.reason == "shed" else "has a full queue for"
        why = (
            f"Model '{model}' {verb} {label}-class requests ({refusal.queued_items} inputs "
            f"waiting, limit {refusal.limit})"
        )
    return Overloaded(
        f"{why}; retry after {refusal.retry_after_s} s.",
        retry_after_s=refusal.retry_after_s,
        status=refusal.status,
        # A predicted wait over the target, or a full ingress, is load shedding by another
        # measure; the code stays one clients already know.
        code="queue_full" if refusal.reason == "queue_full" else "load_shed",
    )
