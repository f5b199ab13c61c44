"""The batching a batched deployment (embedder, reranker) holds: the Serve side of the job
lifecycle in `batched_jobs`, the same for every task that batches items.

A deployment loads its model on its `ModelThreads`, chooses the runtime there and spreads the
threads over the passes the runtime runs side by side; then it builds a `Batcher` with its
task's plug-in (`embed_task.EmbedTask`, `rerank_task.RerankTask`) and hands it every call:

- `run(call)` takes a call's jobs of one class through `batched_jobs.run_jobs`, with that
  class's `@serve.batch` queue as the batcher (`batch_queues`), each formed batch through
  the gate and the model (`forward_pass`), and keeps each job's state for `forget`;
- `reconfigure` applies new batch limits (Serve's user_config), `info` reports;
- `finish_warm_up`, after the warm-up batch, probes the memory and caps every class's token
  budget at what fits, sets the memory limit, opens the device's turns (shared with the
  other models' replicas on it, replicas/device_turns.py) and makes the replica healthy.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import ray

from deployments.config import EncoderModelConfig
from deployments.config.base import ModelBatching
from deployments.core.batching.batch_tuner import BatchTuner
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.priority import ALL_PRIORITIES
from deployments.core.protocol import BatchJob, JobCall, Rejection
from deployments.core.serving_process import tune_serving_process
from deployments.metrics import build_metrics
from deployments.replicas.batched.batch_queues import BatchQueues
from deployments.replicas.batched.batched_jobs import JobState, JobTask, run_jobs
from deployments.replicas.batched.forward_pass import ForwardPasses
from deployments.replicas.batched.model_threads import ModelThreads
from deployments.replicas.batched.pass_counters import PassCounters
from deployments.replicas.batched.replica_memory import ReplicaMemory
from deployments.replicas.busy_scaling import BUSY_METRIC
from deployments.replicas.device_memory import DeviceMemory
from deployments.replicas.device_turns import open_turns

JobT = TypeVar("JobT", bound=BatchJob)
OutcomeT = TypeVar("OutcomeT")


class Batcher(Generic[JobT, OutcomeT]):
    def __init__(
        self,
        config: EncoderModelConfig,
        task: JobTask[JobT, Any, OutcomeT],
        threads: ModelThreads,
        device: DeviceMemory,
        fence: str | None = None,
        metrics: TributaryMetrics | None = None,
    ) -> None:
        """`config`: the model's (its name labels the metrics, its batching is the start's);
        `threads`: already spread over the runtime's passes; `device`: where the model runs;
        `fence`: what `apply_memory_fence` set before the model loaded; `metrics`: None
        records into Ray's."""
        self.name = config.name
        self._config = config
        self._device = device.device
        self._task = task
        self._threads = threads
        self.metrics = metrics or build_metrics()
        self.memory = ReplicaMemory(config, device, self.metrics, fence)
        self._counters = PassCounters()
        self.queues = BatchQueues(
            config.name,
            config.batching,
            lambda priority, items: self.passes.run(priority, items),
            # With device turns, one batch per class more is formed and waits at the gate
            # while the passes run: it is there when a pass ends, so the device can be kept
            # for it where it ranks first (replicas/device_turns.py).
            threads.passes + (1 if config.device_arbiter.enabled else 0),
            self.metrics,
            # And one realtime batch more, for the lane.
            realtime_extra=1 if threads.has_lane else 0,
        )
        self.passes = ForwardPasses(
            config.name,
            task.compute,
            threads,
            self.queues.tuner,
            self.queues.retune,
            self._counters,
            self.memory,
            self.metrics,
        )
        self._order_at_the_gate(config.batching)
        self._live: dict[str, JobState] = {}  # jobs queued or in a pass, by job_id
        self._jobs_here = dict.fromkeys(ALL_PRIORITIES, 0)  # per class, queued or in a pass
        self.warm = False

    @property
    def tuner(self) -> BatchTuner:
        return self.queues.tuner

    @property
    def batching(self) -> ModelBatching:
        return self.queues.batching

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """New batch limits per class: Serve's user_config, applied with no restart."""
        batching = ModelBatching.model_validate(user_config)
        self.queues.reconfigure(batching)
        self._order_at_the_gate(batching)

    def _order_at_the_gate(self, batching: ModelBatching) -> None:
        gate = self.passes.gate
        gate.set_aged_after_s({p: batching.of(p.label).aged_after_s for p in ALL_PRIORITIES})
        gate.set_realtime_hold_s(batching.realtime_hold_ms / 1000)
        self.passes.shared = batching.shared_passes

    def finish_warm_up(self, run_rows: Callable[[int], object], window: int) -> None:
        """After the warm-up batch: passes of growing size (`run_rows(rows)` runs `rows`
        full rows of `window` padded tokens) until the memory the config allows, every
        class's token budget capped at what fits (core/memory/token_ceiling.py); then the
        memory limit, and the replica is healthy, its collector relaxed
        (core/gc_policy.py)."""
        largest = max(self.batching.of(p.label).max_batch_tokens for p in ALL_PRIORITIES)
        ceiling = self.memory.probe(self._threads, run_rows, window, largest)
        if ceiling is not None:
            self.tuner.set_memory_ceiling(ceiling.tokens)
            self.queues.retune()
        self.memory.read_device(self.tuner.backoff.ceiling, force=True)
        self.memory.limit()
        # Turns at the device from the first request on (the warm-up took none).
        self.passes.turns = open_turns(
            self._config,
            self._device,
            self._threads.torch_threads,
            self._threads.passes,
            self.metrics,
        )
        self.warm = True
        if ray.is_initialized():
            tune_serving_process(self.name)

    def check_health(self) -> None:
        """Serve's health check: not healthy until the warm-up batch has run."""
        if not self.warm:
            raise RuntimeError("model not warmed up")

    async def run(self, call: JobCall[JobT]) -> list[OutcomeT | Rejection]:
        """One call from the ingress: its jobs, each with a `JobState` known to `forget`
        meanwhile, through the lifecycle with the class's `@serve.batch` queue."""
        klass = call.priority
        now = time.monotonic()
        self.tuner.admitted_by(klass.label, call.target_s, call.shedding)
        states = [
            JobState(
                job.request_id,
                None if left is None else now + left,
                arrived=now,
                began=now - before,
            )
            for job, left, before in zip(call.jobs, call.time_left_s, call.spent_s, strict=True)
        ]
        ids = [job.job_id for job in call.jobs]
        for job_id, state in zip(ids, states, strict=True):
            self._live[job_id] = state
        company = len(call.jobs) > 1 or self._jobs_here[klass] > 0
        self._jobs_here[klass] += len(call.jobs)
        try:
            return await run_jobs(
                self._task,
                call.jobs,
                states,
                self.queues.budget(klass),
                self.queues.queue(klass),
                on_planned=lambda items: self.queues.arrived(klass, items, company),
            )
        except asyncio.CancelledError:
            # Serve cancels the call when every client of it went away.
            for state in states:
                state.cancelled = True
            raise
        finally:
            self._jobs_here[klass] -= len(call.jobs)
            for job_id in ids:
                self._live.pop(job_id, None)

    def forget(self, job_ids: list[str]) -> int:
        """Jobs whose client went away: their items are dropped before the model runs."""
        found = 0
        for job_id in job_ids:
            state = self._live.get(job_id)
            if state is not None:
                state.cancelled = True
                found += 1
        return found

    def autoscaling_stats(self) -> dict[str, float]:
        """What Serve's controller reads for the deployment's autoscaling policy
        (`replicas/busy_scaling.py`), every `metrics_interval_s`."""
        return {BUSY_METRIC: self.passes.busy.read()}

    def info(self) -> dict[str, Any]:
        """The batching's figures, for the replica's info (/v1/stats)."""
        return {
            "pid": os.getpid(),
            "passes_in_flight": self._threads.passes,
            "threads": self._threads.report(),
            "batching": self.batching.model_dump(),
            **self._counters.report(),
            "gate": vars(self.passes.gate.stats),
            **self.tuner.report(),
            "capacity_rows_per_s": _rounded(self.tuner.full_pass_rows_per_s(self._threads.passes)),
            "plans": self.queues.plans_report(),
            "jobs_in_progress": len(self._live),
            "memory": {
                **self.memory.report(),
                "token_cap": self.tuner.backoff.cap,
                "token_ceiling": self.tuner.backoff.ceiling,
                "device": self.memory.read_device(self.tuner.backoff.ceiling, force=True),
            },
            "recent_drops": self._counters.recent_drops(),
            "device_turns": None if self.passes.turns is None else self.passes.turns.report(),
        }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
