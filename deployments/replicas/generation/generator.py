"""The generation deployment: a causal LM behind priority-aware slots, streaming tokens.

The ingress calls `generate` with `handle.options(stream=True)`; it is an async generator
that yields `GenerationChunk`s as tokens come (or one `Rejection`). The engine is
transformers' continuous-batching manager by default (`engine: continuous`: sequences join
and leave the running batch at every step, on the manager's own thread) or, for
comparison, `@serve.batch` over batched `generate` (`engine: static`). In front of either,
`SequenceSlots` admits at most `max_num_seqs` sequences and `kv_cache_tokens` tokens,
realtime first, with ageing and deadlines (generation_worker.py). When the caller goes
away, the ingress sends a stop note (`stop_sequence`) that ends the generator as if it had
finished, and the sequence is cancelled in the engine at once; a cancel from Serve does the
same, at the price of a leak in gRPC (docs/reliability.md), so the ingress avoids it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from pathlib import Path
from typing import Any

import ray
import torch

from deployments.backends.generation.causal_lm import CausalLM, resolve_lm_source
from deployments.backends.generation.continuous import (
    ContinuousEngine,
    ContinuousSettings,
    first_output,
)
from deployments.backends.generation.sampling import SamplingParams
from deployments.config import GenerationModelConfig, GenerationQueue
from deployments.core.batching.sequence_slots import SequenceSlots, SlotLimits
from deployments.core.memory.kv_budget import KvBudget, derive
from deployments.core.priority import ALL_PRIORITIES, Priority
from deployments.core.protocol import GenerationJob
from deployments.core.serving_process import tune_serving_process
from deployments.metrics import build_metrics
from deployments.replicas.device import assigned_device, torch_dtype
from deployments.replicas.device_turns import ReplicaTurns, open_turns
from deployments.replicas.generation.generation_worker import Event, GenerationWorker
from deployments.replicas.generation.static_engine import StaticEngine

logger = logging.getLogger("ray.serve")

WARMUP_PROMPT = "tributary warms up the generation path"


def kv_budget(config: GenerationModelConfig, lm: CausalLM, device: str) -> KvBudget:
    """The KV cache's tokens and the sequence count: as configured, or from memory."""
    budget: int | None = None
    source = ""
    if config.kv_cache_tokens is None:
        if device.startswith("cuda"):
            free, _ = torch.cuda.mem_get_info(torch.device(device))
            budget = int(free * config.kv_cache_memory_fraction)
            source = f"{config.kv_cache_memory_fraction:g} of {free / 2**30:.1f} GiB free"
        else:
            budget = config.kv_cache_memory_mib * 2**20
            source = f"kv_cache_memory_mib {config.kv_cache_memory_mib}"
    return derive(
        lm.kv_shape(),
        budget,
        source,
        config.page_size,
        2 * config.default_max_tokens,
        config.kv_cache_tokens,
        config.max_num_seqs,
    )


class Generator:
    def __init__(self, model: dict[str, Any]) -> None:
        config = GenerationModelConfig.model_validate(model)
        self.config = config
        if ray.is_initialized():
            tune_serving_process(f"generate-{config.name}", collect_less=False)
        device = self.device = assigned_device()
        cache_dir = Path(config.cache_dir) if config.cache_dir else None
        path = resolve_lm_source(config.source, cache_dir)
        threads = config.torch_threads or torch.get_num_threads()
        self.lm = CausalLM(path, device, torch_dtype(config.dtype, device))
        self.kv = kv_budget(config, self.lm, device)
        self.slots = SequenceSlots(self._limits(GenerationQueue()))
        if config.engine == "continuous":
            settings = ContinuousSettings(
                max_batch_tokens=config.max_batch_tokens,
                kv_cache_tokens=self.kv.kv_cache_tokens,
                page_size=config.page_size,
                scheduler=config.scheduler,
                max_num_seqs=self.kv.max_num_seqs,
                torch_threads=threads,
            )
            self.engine: ContinuousEngine | StaticEngine = ContinuousEngine(self.lm, settings)
            self.engine.start()
        else:
            executor = ThreadPoolExecutor(
                max_workers=1, initializer=torch.set_num_threads, initargs=(threads,)
            )
            self.engine = StaticEngine(
                self.lm, executor, self.kv.max_num_seqs, config.static_batch_wait_s
            )
        self.worker = GenerationWorker(
            self.lm, self.engine, self.slots, model=config.name, metrics=build_metrics()
        )
        self._warm_up()
        self.turns = open_turns(config, device, threads, 1, self.worker.metrics)
        if self.turns is not None and isinstance(self.engine, ContinuousEngine):
            self.engine.step_hooks = _StepTurns(self.turns, self.worker)
            self.worker.on_idle = self.turns.drop_kept
        logger.info(
            "generation model %s (%s engine) ready on %s from %s, %d torch threads; %d KV "
            "tokens, %d sequences (%s)",
            config.name,
            config.engine,
            device,
            path,
            threads,
            self.kv.kv_cache_tokens,
            self.kv.max_num_seqs,
            self.kv.source,
        )

    def _warm_up(self) -> None:
        prompt = self.lm.prompt_ids(WARMUP_PROMPT)
        if isinstance(self.engine, ContinuousEngine):
            # The manager delivers results on the loop that registered for them; the
            # replica's own loop may not be running yet, so warm up on a loop of our own.
            engine = self.engine
            thread = threading.Thread(target=lambda: asyncio.run(first_output(engine, prompt, 8)))
            thread.start()
            thread.join()
        else:
            self.lm.generate([prompt, prompt[:2]], [8, 4], [SamplingParams(0.0)] * 2)
        self._warm = True

    def _limits(self, queue: GenerationQueue) -> SlotLimits:
        return SlotLimits(
            max_num_seqs=self.kv.max_num_seqs,
            max_tokens=self.kv.kv_cache_tokens,
            max_queued={p: queue.max_queued.get(p.label, 0) for p in ALL_PRIORITIES},
            aged_after_s={p: queue.aged_after_s.get(p.label) for p in ALL_PRIORITIES},
        )

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        self.queue = GenerationQueue.model_validate(user_config)
        self.slots.set_limits(self._limits(self.queue))

    def check_health(self) -> None:
        if not getattr(self, "_warm", False):
            raise RuntimeError("model not warmed up")
        if not self.engine.alive:
            raise RuntimeError("the generation engine has stopped")

    def _watch(self) -> None:
        """Keeps the engine's watchdog running on the replica's loop (started lazily:
        that loop is not running yet in __init__). It fails every sequence of a dead
        engine at once and restarts the engine in-process (continuous.py)."""
        if not isinstance(self.engine, ContinuousEngine):
            return
        task = getattr(self, "_watchdog", None)
        if task is None or task.done():
            self._watchdog = asyncio.get_running_loop().create_task(self.engine.watch())

    async def engine_alive(self, probe_key: str | None = None) -> bool:
        """For the ingress's /healthz and replica watch: cheap, and honest within the
        watchdog's period. `probe_key` is read by the ingress's router only
        (ingress/calls/silent_replicas.py)."""
        self._watch()
        return self.engine.alive

    async def drill_engine_failure(self) -> bool:
        """Reliability drills only (reached through a Ray handle, never over HTTP): ends
        the engine's thread as a crash would, so that the time to the first 503 and to
        recovery can be measured. False for an engine without a thread (static)."""
        if not isinstance(self.engine, ContinuousEngine):
            return False
        logger.warning("drill: ending the generation engine's thread of %s", self.config.name)
        self._watch()
        self.engine.drill_failure()
        return True

    async def generate(
        self,
        priority: str,
        job: GenerationJob,
        time_left_s: float | None,
        stop_key: str | None = None,
    ) -> AsyncIterator[Event]:
        """The job's events; `stop_sequence(stop_key)` ends them early."""
        self._watch()
        run = self.worker.run(Priority.parse(priority), job, time_left_s, stop_key)
        async with aclosing(run) as events:
            async for event in events:
                yield event

    async def stop_sequence(self, stop_key: str) -> bool:
        """The ingress's note that the caller of `generate(..., stop_key)` has gone: the
        stream ends at once, as a finished one does. False if this replica has no such run
        (it ended, or it runs on another replica)."""
        return self.worker.stop(stop_key)

    def model_config(self) -> dict[str, Any]:
        """What the ingress needs of a version served by an application of its own."""
        return {"task": "generation", "config": self.config.model_dump(mode="json")}

    def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "task": "generation",
            "engine": self.config.engine,
            "device": self.device,
            "dtype": str(self.lm.model.dtype).removeprefix("torch."),
            "max_num_seqs": self.kv.max_num_seqs,
            "kv_cache": self.kv.report(),
            "context_window": self.lm.context_window,
            **self.engine.stats(),
            **self.worker.stats(),
            "device_turns": None if self.turns is None else self.turns.report(),
        }

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if isinstance(engine, ContinuousEngine):
            engine.stop()


class _StepTurns:
    """The engine's step hooks: a turn at the device around each step, at the class of
    the step's most urgent sequence."""

    def __init__(self, turns: ReplicaTurns, worker: GenerationWorker) -> None:
        self._turns = turns
        self._worker = worker

    def before_step(self) -> None:
        self._turns.before_step(self._worker.step_class())

    def after_step(self) -> None:
        # Sequences left: the engine steps again at once, and may keep the device for it.
        following = self._worker.step_class() if self._worker.running else None
        self._turns.after_step(following)
