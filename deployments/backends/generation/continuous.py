"""Continuous batching through transformers' own manager, bridged to asyncio.

The manager runs the model on a background thread of its own and admits and retires
sequences at every decoding step over a paged KV cache. Results come back through
`register_result_handler`, which hands each output to the event loop with
`call_soon_threadsafe`: nothing on the loop blocks or polls (the manager's iterators
busy-poll a queue, which starved the generation thread on a 2-core machine).

Sampling goes through `_PerRequestSampler` (see sampling.py): the manager itself runs
greedy, and each sampled sequence draws from its own seeded generator.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig, LogitsProcessorList
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)

from deployments.backends.generation.causal_lm import CausalLM
from deployments.backends.generation.sampling import RowSampler, SamplingParams, sample_rows

logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class EngineOutput:
    """What a sequence has so far: every generated token (EOS excluded), and whether it
    is over (`finished`), with `error` set when the engine failed it. `engine_down` says
    the failure was the engine's as a whole, not this sequence's: retrying can succeed."""

    tokens: list[int]
    finished: bool
    hit_eos: bool = False
    error: str | None = None
    engine_down: bool = False


OnOutput = Callable[[EngineOutput], None]
RowSamplerFactory = Callable[[SamplingParams], RowSampler]
# Called on the manager's thread: (request id, what went wrong).
OnRowError = Callable[[str, Exception], None]

# How often the watchdog looks at the manager's thread (named constants, not config
# knobs: a dead engine should be noticed faster than any client would care to tune).
WATCH_PERIOD_S = 0.2
STOP_TIMEOUT_S = 10.0  # how long a replica's shutdown waits for the thread to finish
# After a restart that failed, the next try waits this long: a failure that repeats
# (out of memory, say) must not spin; the replica reports unhealthy meanwhile.
RESTART_BACKOFF_S = 5.0


class EngineDown(Exception):
    """The engine cannot take a sequence now: its thread stopped, a restart is under way."""


@dataclass(frozen=True)
class ContinuousSettings:
    max_batch_tokens: int = 256
    kv_cache_tokens: int = 16384
    page_size: int = 32
    scheduler: str = "fifo"
    max_num_seqs: int = 32
    torch_threads: int = 0  # 0 = torch's default


class StepHooks(Protocol):
    """Called on the manager's thread around each step's forward pass: the turn at a
    device shared with other models (replicas/device_turns.py)."""

    def before_step(self) -> None: ...

    def after_step(self) -> None: ...


def _quietly(hook: Callable[[], None]) -> None:
    # An exception on the manager's thread would end it and every sequence with it; a
    # step that cannot take its turn runs without one.
    try:
        hook()
    except Exception:
        logger.exception("a device-turn hook failed; the step runs without a turn")


class _PerRequestSampler(ContinuousBatchingLogitsProcessor):
    supported_kwargs: dict[str, type] = {}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(
        self,
        torch_threads: int,
        eos: int | None,
        on_row_error: OnRowError,
        step_hooks: Callable[[], StepHooks | None] = lambda: None,
    ) -> None:
        self.samplers: dict[str, RowSampler] = {}
        self._step_hooks = step_hooks
        self._rows: list[RowSampler | None] = []
        self._ids: list[str] = []
        self._torch_threads = torch_threads
        self._threads_set = False
        self._eos = eos
        self._on_row_error = on_row_error

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(0)

    def prepare_tensor_args(self, requests_with_new_token: list[Any]) -> torch.Tensor:
        # Called on the generation thread right before the step's forward pass, with the
        # rows in the order of the step's logits: remember which sampler each row uses.
        if not self._threads_set and self._torch_threads:
            # Torch's thread count belongs to the OS thread, and this is the first code of
            # ours to run on the manager's generation thread.
            torch.set_num_threads(self._torch_threads)
            self._threads_set = True
        self._ids = [r.state.request_id for r in requests_with_new_token]
        self._rows = [self.samplers.get(request_id) for request_id in self._ids]
        hooks = self._step_hooks()
        if hooks is not None:
            _quietly(hooks.before_step)
        return torch.zeros(len(self._rows), dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        # The step's forward pass is over: its turn at the device goes back first.
        hooks = self._step_hooks()
        if hooks is not None:
            _quietly(hooks.after_step)
        # An exception here would end the manager's thread and every sequence with it: a
        # row that fails is ended (EOS) and its request failed alone.
        failed = sample_rows(scores, self._rows[: scores.size(0)])
        for i, error in failed.items():
            if self._eos is not None:
                scores[i].fill_(float("-inf"))
                scores[i, self._eos] = 0.0
            self._on_row_error(self._ids[i], error)
        return scores


@dataclass
class _Sequence:
    on_output: OnOutput
    loop: asyncio.AbstractEventLoop


class ContinuousEngine:
    def __init__(
        self,
        lm: CausalLM,
        settings: ContinuousSettings,
        row_sampler: RowSamplerFactory = RowSampler.of,
    ) -> None:
        self.lm = lm
        # Turns at a shared device around each step; set once the replica is warm.
        self.step_hooks: StepHooks | None = None
        self.settings = settings
        self._row_sampler = row_sampler
        self._live: dict[str, _Sequence] = {}
        self._stopping = False
        self.cancelled = 0
        self.stray_outputs = 0  # outputs that came after their sequence was cancelled
        self.finished = 0
        self.failed = 0
        self.generated_tokens = 0
        self.restarts = 0
        self.last_restart_s: float | None = None
        self._retry_restart_at = 0.0
        self.manager, self._sampler = self._new_manager()

    def _new_manager(self) -> tuple[Any, _PerRequestSampler]:
        lm, settings = self.lm, self.settings
        generation = GenerationConfig(
            do_sample=False,
            eos_token_id=sorted(lm.eos_ids) or -1,
            pad_token_id=lm.pad_id,
            max_new_tokens=lm.context_window,
        )
        config = ContinuousBatchingConfig(
            max_batch_tokens=settings.max_batch_tokens,
            # Sized here: left to itself the manager sizes the cache from free memory, which
            # on a CPU host is most of the RAM and took ~30 s to allocate.
            num_blocks=-(-settings.kv_cache_tokens // settings.page_size),
            page_size=settings.page_size,
            scheduler_type=settings.scheduler,
            max_requests_per_batch=settings.max_num_seqs,
            # Prompts here seldom share a prefix, and sharing costs bookkeeping per step.
            allow_block_sharing=False,
        )
        manager = lm.model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=config
        )
        eos = min(lm.eos_ids) if lm.eos_ids else None
        sampler = _PerRequestSampler(
            settings.torch_threads, eos, self._row_failed, lambda: self.step_hooks
        )
        processors = ContinuousBatchingLogitsProcessorList(LogitsProcessorList([sampler]))
        processors.tensors_required = 1  # one int32 row of arguments, unused by ours
        # Replaces the manager's (empty) list before its batch processor is created in start().
        manager.logit_processor = processors
        return manager, sampler

    def start(self) -> None:
        self._stopping = False
        self.manager.start()

    def stop(self) -> None:
        self._stopping = True
        self.manager.stop(block=True, timeout=STOP_TIMEOUT_S)

    @property
    def alive(self) -> bool:
        """Whether the manager's thread runs and takes new sequences."""
        return self.manager.is_running() and not self._is_stopping(self.manager)

    def submit(
        self,
        request_id: str,
        prompt: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        on_output: OnOutput,
    ) -> None:
        """Starts a sequence; `on_output` gets its progress on the running loop, one call
        per generated token and a last one with `finished`. Call from the event loop.
        Raises EngineDown when the engine cannot take it (it would never be answered)."""
        if not prompt:
            raise ValueError("a sequence needs at least one prompt token")
        if not self.alive:
            raise EngineDown("the generation engine is not running")
        manager = self.manager
        if not sampling.greedy:
            self._sampler.samplers[request_id] = self._row_sampler(sampling)
        eos = self.lm.eos_ids

        def deliver(output: Any) -> None:
            if self._live.get(request_id) is not sequence:
                return  # cancelled or failed already: its late outputs go nowhere
            tokens = list(output.generated_tokens)
            finished = output.is_finished() or output.error is not None
            hit_eos = bool(tokens) and tokens[-1] in eos
            if hit_eos:
                tokens = tokens[:-1]
            error = output.error
            # The manager fails every sequence itself when its loop dies, after asking
            # itself to stop: such an error is the engine's, not the sequence's.
            engine_down = error is not None and self._is_stopping(manager)
            if finished:
                self._forget(request_id)
                if error is None:
                    self.finished += 1
                    self.generated_tokens += len(tokens)
                else:
                    self.failed += 1
            on_output(EngineOutput(tokens, finished, hit_eos, error, engine_down))

        sequence = _Sequence(on_output, asyncio.get_running_loop())
        manager.register_result_handler(request_id, deliver)
        self._live[request_id] = sequence
        added = manager.add_request(
            list(prompt), request_id=request_id, max_new_tokens=max_new_tokens, streaming=True
        )
        if added is None:  # the manager refused it: its thread stopped meanwhile
            self._forget(request_id)
            self._drop_handler(manager, request_id)
            raise EngineDown("the generation engine stopped")

    @staticmethod
    def _is_stopping(manager: Any) -> bool:
        return manager.background_thread_status.can_accept_new_requests() is not None

    def _row_failed(self, request_id: str, error: Exception) -> None:
        """On the manager's thread: one sequence's sampling raised. Its row was ended with
        EOS; its request is failed on its own loop."""
        logger.error("sequence %s failed in the sampler: %r", request_id, error)
        sequence = self._live.get(request_id)
        if sequence is not None:
            message = f"sampling failed: {type(error).__name__}"
            sequence.loop.call_soon_threadsafe(self._fail, request_id, sequence, message)

    def _fail(self, request_id: str, sequence: _Sequence, message: str) -> None:
        if self._live.get(request_id) is not sequence:
            return
        self._forget(request_id)
        if not self.lm.eos_ids:  # no EOS to end its row with: cancel it instead
            self.manager.cancel_request(request_id)
        self._drop_handler(self.manager, request_id)
        self.failed += 1
        sequence.on_output(EngineOutput([], True, error=message))

    def cancel(self, request_id: str) -> None:
        """Frees the sequence's slot and KV blocks at the manager's next step. No output
        follows a cancel, so its handler is removed here."""
        if request_id not in self._live:
            return  # finished already
        self.manager.cancel_request(request_id)
        self._drop_handler(self.manager, request_id)
        self._forget(request_id)
        self.cancelled += 1

    def _forget(self, request_id: str) -> None:
        self._live.pop(request_id, None)
        self._sampler.samplers.pop(request_id, None)

    @staticmethod
    def _drop_handler(manager: Any, request_id: str) -> None:
        router = manager.output_router
        with router._lock:  # the manager has no public way to drop a handler
            router.result_handlers.pop(request_id, None)

    def check(self) -> bool:
        """On the event loop: if the manager's thread has stopped (for any reason but our
        own stop), fail every live sequence now, as the engine's failure, and start a new
        manager over the loaded model. Returns whether the engine is alive afterwards.
        Also drops the outputs nobody will read (`_discard_strays`)."""
        self._discard_strays()
        if self.alive or self._stopping:
            return self.alive
        self._fail_all("the generation engine stopped; it is restarting")
        if self.manager.is_running():
            return False  # still winding down: restart once its thread is gone
        began = time.monotonic()
        if began < self._retry_restart_at:
            return False
        try:
            self.manager, self._sampler = self._new_manager()
            self.manager.start()
        except Exception:
            logger.exception("could not restart the continuous-batching engine")
            self._retry_restart_at = began + RESTART_BACKOFF_S
            return False
        self.restarts += 1
        self.last_restart_s = time.monotonic() - began
        logger.warning(
            "continuous-batching engine restarted in %.2f s (restart %d)",
            self.last_restart_s,
            self.restarts,
        )
        return self.alive

    def _discard_strays(self) -> None:
        """The manager puts an output whose request has no handler on a shared queue, and
        nothing here reads it: every sequence has a handler, dropped when it is cancelled,
        and the step in flight then (or the next, before the manager takes the cancel)
        still makes an output. Left there, each would stay for good: ~1 KB of every client
        that leaves a stream."""
        strays = self.manager.output_router.output_queue
        while True:
            try:
                strays.get_nowait()
            except queue.Empty:
                return
            self.stray_outputs += 1

    def _fail_all(self, message: str) -> None:
        for request_id, sequence in list(self._live.items()):
            self._forget(request_id)
            self._drop_handler(self.manager, request_id)
            self.failed += 1
            sequence.on_output(EngineOutput([], True, error=message, engine_down=True))

    def drill_failure(self) -> None:
        """Ends the manager's thread the way a crash does (no stop of ours, so `check`
        treats it as a death): for tests and reliability drills of the recovery path."""
        status = self.manager.background_thread_status
        status.request_stop(status.HARD_STOP, self.manager.distributed_helper.global_rank)
        self.manager._wake_up_loop.set()  # an idle loop waits on it for up to 0.1 s

    async def watch(self, period_s: float = WATCH_PERIOD_S) -> None:
        """Runs `check` every `period_s` until cancelled: the replica notices a dead engine
        within a period instead of when a request's deadline passes."""
        while True:
            try:
                self.check()
            except Exception:  # the watchdog must outlive whatever it is watching
                logger.exception("the generation engine's watchdog failed a check")
            await asyncio.sleep(period_s)

    @property
    def running(self) -> int:
        return len(self._live)

    def stats(self) -> dict[str, Any]:
        return {
            "running_sequences": self.running,
            "finished_sequences": self.finished,
            "cancelled_sequences": self.cancelled,
            "stray_outputs_dropped": self.stray_outputs,
            "failed_sequences": self.failed,
            "generated_tokens": self.generated_tokens,
            "generation_thread_alive": self.alive,
            "engine_restarts": self.restarts,
        }


async def first_output(engine: ContinuousEngine, prompt: list[int], max_new: int) -> EngineOutput:
    """Runs one sequence to the end; for warm-up and tests."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[EngineOutput] = loop.create_future()

    def on_output(output: EngineOutput) -> None:
        if output.finished and not done.done():
            done.set_result(output)

    engine.submit(f"warmup-{id(done)}", prompt, max_new, SamplingParams(0.0), on_output)
    return await done
