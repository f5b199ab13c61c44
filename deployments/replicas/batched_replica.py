"""The batched replica: the Serve side of the lifecycle in `batched_jobs`, shared by the
model deployments of every task that batches items (embedder, reranker).

A deployment class inherits `BatchedReplica`, loads its model and sets `self.task`, its
task's plug-in (`embed_task.EmbedTask`, `rerank_task.RerankTask`). The base runs each call's
jobs through `batched_jobs.run_jobs` with one `@serve.batch` queue per priority class
(sized by count and padded tokens through each item's `BatchBudget`) as the batcher, the
priority gate (one forward pass at a time, or `passes_in_flight` side by side on as many
model threads; the most urgent waiting batch first, with ageing), the drop of items whose
job expired or lost its client just before the pass, the task's `compute` on a model
thread, job bookkeeping for `forget`, and the counters `info()` reports.

`@serve.batch` keeps its queue on the decorated function, so it is shared by the
instances of one process: fine for Serve, which runs one replica per actor process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray
import torch
from ray import serve

from deployments.config import ModelBatching
from deployments.core.batch_budget import BatchBudget, budget_size
from deployments.core.batch_policy import BatchPlan, ClassLimits
from deployments.core.batch_tuner import BatchTuner
from deployments.core.gc_policy import relax_collector
from deployments.core.priority import ALL_PRIORITIES, Priority
from deployments.core.priority_gate import PriorityGate
from deployments.core.split_retry import SplitReport, run_split
from deployments.metrics import build_metrics
from deployments.replicas.batched_jobs import (
    EXPIRED,
    Dropped,
    JobState,
    JobTask,
    run_jobs,
    split_live,
)
from deployments.replicas.device_memory import DeviceMemory
from deployments.replicas.memory import (
    apply_memory_fence,
    apply_memory_limit,
    is_memory_fault,
    release_cached_memory,
)

logger = logging.getLogger("ray.serve")

# The device's gauges are read at most this often on the pass path (mem_get_info is a
# device call; a figure a second old is fresh enough for a dashboard).
DEVICE_EVERY_S = 1.0


class BatchedReplica:
    _executor: ThreadPoolExecutor
    config: Any  # the subclass's model config; its `name` labels the metrics
    # The subclass's task plug-in: how jobs become items, a batch is computed, results
    # become outcomes.
    task: JobTask[Any, Any, Any]
    _warm = False  # set by the subclass once a real batch has run

    def _mark_warm(self) -> None:
        """Start-up is done: ready for Serve's health check; in a replica, the collector
        relaxed (core/gc_policy.py)."""
        self._warm = True
        if ray.is_initialized():
            relax_collector()

    def check_health(self) -> None:
        """Serve's health check: not healthy until the warm-up batch has run."""
        if not self._warm:
            raise RuntimeError("model not warmed up")

    def _init_batching(self, torch_threads: int, batching: ModelBatching) -> int:
        """Sets up the model thread, the class queues and the gate; returns the model
        thread's torch thread count (`torch_threads`, or torch's default when 0)."""
        threads = self._threads = torch_threads or torch.get_num_threads()
        # One worker: the model runs one batch at a time, until `_run_passes` says more.
        # Torch's thread count is per OS thread, so it is set inside the worker.
        self._model_thread_ids: list[int] = []
        self.passes_in_flight = 1
        self._executor = ThreadPoolExecutor(
            max_workers=1, initializer=self._model_thread_starts, initargs=(threads,)
        )
        self._budgets = {p: BatchBudget(1, 1) for p in ALL_PRIORITIES}
        # serve.batch wrappers; Ray's stubs do not show their set_* methods.
        self._runners: dict[Priority, Any] = {
            Priority.REALTIME: self._batch_realtime,
            Priority.NORMAL: self._batch_normal,
            Priority.BATCH: self._batch_batch,
        }
        self.gate = PriorityGate({})
        self.tuner = BatchTuner([p.label for p in ALL_PRIORITIES])
        self._plans: dict[Priority, BatchPlan] = {}
        self.metrics = build_metrics()
        self.reconfigure(batching.model_dump())
        self._live: dict[str, JobState] = {}
        self._jobs_here = dict.fromkeys(ALL_PRIORITIES, 0)  # per class, queued or in a pass
        self._counts = {"batches": 0, "items": 0, "expired_items": 0, "client_gone_items": 0}
        self._class_counts = {p: {"batches": 0, "items": 0} for p in ALL_PRIORITIES}
        self._recent_drops: deque[dict[str, str]] = deque(maxlen=256)
        self._memory: dict[str, Any] = {
            "out_of_memory": 0,
            "split_retries": 0,
            "failed_alone": 0,
            "fence": None,
            "limit": None,
            "probe": None,
        }
        # Replaced by `_fence_memory` with the replica's real device.
        self.device_memory = DeviceMemory("cpu")
        self._device_read = 0.0
        return threads

    def _model_thread_starts(self, threads: int) -> None:
        torch.set_num_threads(threads)
        self._model_thread_ids.append(threading.get_native_id())

    def _run_passes(self, passes: int) -> None:
        """After the runtime is built for `passes` at once (its `passes_in_flight`): as
        many model threads sharing the threads, and as many turns at the gate and batches
        of one class in flight. Before the first request: Serve's batch queues read
        their concurrency when they are created."""
        if passes <= 1:
            return
        each = max(1, self._threads // passes)
        single, self._model_thread_ids = self._executor, []
        self._executor = ThreadPoolExecutor(
            max_workers=passes, initializer=self._model_thread_starts, initargs=(each,)
        )
        single.shutdown(wait=True)
        for runner in self._runners.values():
            # Serve's decorator fixes a queue's concurrency at decoration time and keeps
            # it on the lazy wrapper its setters are bound to, read at the first request.
            queue = getattr(runner.set_max_batch_size, "__self__", None)
            if queue is None or not hasattr(queue, "max_concurrent_batches"):
                raise RuntimeError("this Ray's @serve.batch cannot run batches side by side")
            queue.max_concurrent_batches = passes
        self.gate.set_capacity(passes)
        self.passes_in_flight = passes

    def _fence_memory(self, device: str, config: Any) -> None:
        """Before the model loads: the GPU share this process may take, if configured."""
        self.device_memory = DeviceMemory(device)
        self._memory["fence"] = apply_memory_fence(device, config.gpu_memory_fraction)

    def _budget_memory(self, config: Any, run_rows: Callable[[int], object], window: int) -> None:
        """After the warm-up batch: passes of growing size (`run_rows(rows)` runs `rows`
        full rows of `window` padded tokens) until the memory the config allows, and
        every class's token budget capped at what fits (core/token_ceiling.py)."""
        allowance = self.device_memory.allowance(
            config.probe_memory_fraction, config.memory_budget_mib, config.gpu_memory_fraction
        )
        if allowance is not None:
            largest = max(self.batching.of(p.label).max_batch_tokens for p in ALL_PRIORITIES)
            started = time.monotonic()
            ceiling = self._executor.submit(
                # Passes side by side share the allowance: each may take its part.
                self.device_memory.probe,
                run_rows,
                window,
                largest,
                allowance[0] // self.passes_in_flight,
            ).result()
            self._memory["probe"] = {
                **ceiling.report(),
                "allowed_from": allowance[1],
                "seconds": round(time.monotonic() - started, 3),
            }
            self.tuner.set_memory_ceiling(ceiling.tokens)
            self._apply_plans()
            logger.info(
                "%s: memory probe over %s padded tokens: ceiling %s tokens (%s)",
                config.name,
                [p.padded_tokens for p in ceiling.points],
                ceiling.tokens,
                ceiling.why,
            )
        self._read_device(force=True)

    def _read_device(self, force: bool = False) -> dict[str, Any] | None:
        """The device's figures into the gauges, at most every DEVICE_EVERY_S unless forced."""
        now = time.monotonic()
        if not force and now - self._device_read < DEVICE_EVERY_S:
            return None
        self._device_read = now
        snapshot = self.device_memory.snapshot()
        self.metrics.device(
            self.config.name,
            {k: snapshot.get(f"{k}_bytes") for k in ("total", "free", "process")},
            snapshot.get("utilization_percent"),
            self.tuner.backoff.ceiling,
        )
        return snapshot

    def _limit_memory(self, config: Any) -> None:
        """After warm-up: the address space the replica may still add, if configured."""
        self._memory["limit"] = apply_memory_limit(config.memory_limit_mib)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        batching = ModelBatching.model_validate(user_config)
        self.batching = batching
        limits: dict[str, ClassLimits] = {}
        for priority in ALL_PRIORITIES:
            settings = batching.of(priority.label)
            target = settings.target_p99_ms
            limits[priority.label] = ClassLimits(
                max_batch_size=settings.max_batch_size,
                max_batch_tokens=settings.max_batch_tokens,
                wait_s=settings.batch_wait_timeout_s,
                target_s=None if target is None else target / 1e3,
            )
        self.tuner.configure(limits, batching.adaptive)
        self._plans.clear()  # every class gets its new plan, changed or not
        self._apply_plans()
        self.gate.set_aged_after_s({p: batching.of(p.label).aged_after_s for p in ALL_PRIORITIES})

    def _apply_plans(self) -> None:
        """Hands each class the batch size, token budget and wait the tuner now chooses;
        Serve's queue reads them when its next batch starts forming."""
        plans = self.tuner.plans()
        for priority in ALL_PRIORITIES:
            plan = plans[priority.label]
            if self._plans.get(priority) == plan:
                continue
            self._plans[priority] = plan
            budget = self._budgets[priority]
            budget.max_batch_size = plan.max_batch_size
            budget.max_batch_tokens = plan.max_batch_tokens
            self._runners[priority].set_max_batch_size(plan.max_batch_size)
            self._runners[priority].set_batch_wait_timeout_s(plan.wait_s)
            self.metrics.batch_plan(
                self.config.name, priority.label, plan.max_batch_tokens, plan.wait_s
            )

    def _arrived(self, priority: Priority, items: int, company: bool) -> None:
        self.tuner.arrived(priority.label, items, company)
        self._apply_plans()

    def batching_info(self) -> dict[str, Any]:
        batches, items = self._counts["batches"], self._counts["items"]
        return {
            "pid": os.getpid(),
            # For bench/cost_budget.py, which tells the forward pass's CPU from the rest:
            # the model thread, and every Python thread (a runtime's own pool is neither).
            "passes_in_flight": self.passes_in_flight,
            "threads": {
                "model": self._model_thread_ids[0] if self._model_thread_ids else None,
                "models": list(self._model_thread_ids),
                "python": sorted(t.native_id for t in threading.enumerate() if t.native_id),
            },
            "batching": self.batching.model_dump(),
            **self._counts,
            "mean_batch_size": items / batches if batches else 0.0,
            "classes": {
                p.label: {
                    **counts,
                    "mean_batch_size": counts["items"] / counts["batches"]
                    if counts["batches"]
                    else 0.0,
                }
                for p, counts in self._class_counts.items()
            },
            "gate": vars(self.gate.stats),
            **self.tuner.report(),
            "plans": {p.label: plan.report() for p, plan in self._plans.items()},
            "jobs_in_progress": len(self._live),
            "memory": {
                **self._memory,
                "token_cap": self.tuner.backoff.cap,
                "token_ceiling": self.tuner.backoff.ceiling,
                "device": self._read_device(force=True),
            },
            "recent_drops": list(self._recent_drops),
        }

    async def _run_call(
        self,
        priority: str,
        jobs: list[Any],
        time_left_s: list[float | None],
        spent_s: list[float] | None = None,
    ) -> list[Any]:
        """One call from the ingress: `jobs` of one class, each with a `JobState` known to
        `forget` meanwhile, through the lifecycle with the class's `@serve.batch` queue.
        `spent_s`: how long each job had been at the ingress when the call left."""
        klass = Priority.parse(priority)
        now = time.monotonic()
        spent = spent_s if spent_s is not None else [0.0] * len(jobs)
        states = [
            JobState(
                job.request_id,
                None if left is None else now + left,
                arrived=now,
                began=now - before,
            )
            for job, left, before in zip(jobs, time_left_s, spent, strict=True)
        ]
        for job, state in zip(jobs, states, strict=True):
            self._live[job.job_id] = state
        company = len(jobs) > 1 or self._jobs_here[klass] > 0
        self._jobs_here[klass] += len(jobs)
        try:
            return await run_jobs(
                self.task,
                jobs,
                states,
                self._budgets[klass],
                self._runners[klass],
                on_planned=lambda items: self._arrived(klass, items, company),
            )
        except asyncio.CancelledError:
            # Serve cancels the call when every client of it went away.
            for state in states:
                state.cancelled = True
            raise
        finally:
            self._jobs_here[klass] -= len(jobs)
            for job in jobs:
                self._live.pop(job.job_id, None)

    def forget(self, job_ids: list[str]) -> int:
        """Jobs whose client went away: their items are dropped before the model runs."""
        found = 0
        for job_id in job_ids:
            state = self._live.get(job_id)
            if state is not None:
                state.cancelled = True
                found += 1
        return found

    async def _forward(self, priority: Priority, items: list[Any]) -> list[Any]:
        async with self.gate.turn(priority):
            # One loop turn first: a cancel or a forget note that arrived during the last
            # forward pass is queued on this loop, and must land before we decide.
            await asyncio.sleep(0)
            started = time.monotonic()
            live, marks = split_live(items, started)
            self._note_drops(priority, marks, items)
            results: list[Any] = []
            if live:
                loop = asyncio.get_running_loop()
                results, report = await loop.run_in_executor(
                    self._executor,
                    run_split,
                    live,
                    self.task.compute,
                    is_memory_fault,
                    release_cached_memory,
                )
                self._count(priority, len(live))
                if report.faults:
                    self._memory_faulted(priority, live, report)
                else:
                    self._measure(priority, live, started)
        computed = iter(results)
        return [mark if mark is not None else next(computed) for mark in marks]

    def _memory_faulted(self, priority: Priority, live: list[Any], report: SplitReport) -> None:
        """A pass ran out of memory and was split: count it and halve the token budget.
        Its time is not a pass's cost, so the cost model does not see it."""
        self._memory["out_of_memory"] += report.faults
        self._memory["split_retries"] += report.splits
        self._memory["failed_alone"] += report.failed_alone
        padded = len(live) * max(item.tokens for item in live)
        self.tuner.memory_fault(padded)
        self._apply_plans()
        name = self.config.name
        self.metrics.memory_faults(name, "out_of_memory", report.faults)
        self.metrics.memory_faults(name, "split_retry", report.splits)
        self.metrics.memory_faults(name, "failed_alone", report.failed_alone)
        logger.warning(
            "%s: a %s pass of %d inputs (%d padded tokens) ran out of memory: %d faults, "
            "%d splits, %d inputs failed alone; token budget now %s",
            name,
            priority.label,
            len(live),
            padded,
            report.faults,
            report.splits,
            report.failed_alone,
            self.tuner.backoff.cap,
        )

    def _count(self, priority: Priority, items: int) -> None:
        self._counts["batches"] += 1
        self._counts["items"] += items
        self._class_counts[priority]["batches"] += 1
        self._class_counts[priority]["items"] += items

    def _measure(self, priority: Priority, live: list[Any], started: float) -> None:
        # One state per job in the batch (its items arrived together): one queue wait each.
        states = {id(item.state): item.state for item in live}
        padded_tokens = len(live) * max(item.tokens for item in live)
        inference_s = time.monotonic() - started
        self.metrics.batch_ran(
            self.config.name,
            priority.label,
            size=len(live),
            padded_tokens=padded_tokens,
            inference_s=inference_s,
            queue_waits_s=[started - state.arrived for state in states.values()],
        )
        self.tuner.ran(priority.label, len(live), padded_tokens, inference_s)
        ended = time.monotonic()
        # From the ingress's arrival, not this replica's: a target is the client's, and
        # under load the ingress's queue is part of what it waits. (The hop here is not:
        # the ingress can only say what was spent when the call left.)
        self.tuner.waited(
            priority.label, [(state.arrived, ended - state.began) for state in states.values()]
        )
        self._apply_plans()
        fit = self.tuner.cost.current
        if fit is not None:
            self.metrics.cost_model(self.config.name, fit)
        self._read_device()

    def _note_drops(
        self, priority: Priority, marks: list[Dropped | None], items: list[Any]
    ) -> None:
        noted: set[int] = set()
        dropped: dict[str, int] = {}
        for mark, item in zip(marks, items, strict=True):
            if mark is None:
                continue
            self._counts[f"{mark.reason}_items"] += 1
            dropped[mark.reason] = dropped.get(mark.reason, 0) + 1
            if id(item.state) not in noted:
                noted.add(id(item.state))
                self._recent_drops.append(
                    {"request_id": item.state.request_id, "reason": mark.reason}
                )
        for reason, count in dropped.items():
            label = "deadline" if reason == EXPIRED else reason
            self.metrics.items_dropped(self.config.name, priority.label, label, count)

    # One queue per class, each with its own size, wait and token budget (reconfigure
    # sets them); a class's batch size is measured by its items' budget.
    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.002, batch_size_fn=budget_size)
    async def _batch_realtime(self, items: list[Any]) -> list[Any]:
        return await self._forward(Priority.REALTIME, items)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.01, batch_size_fn=budget_size)
    async def _batch_normal(self, items: list[Any]) -> list[Any]:
        return await self._forward(Priority.NORMAL, items)

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.05, batch_size_fn=budget_size)
    async def _batch_batch(self, items: list[Any]) -> list[Any]:
        return await self._forward(Priority.BATCH, items)
