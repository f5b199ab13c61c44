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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig, LogitsProcessorList
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
    ContinuousBatchingLogitsProcessorList,
)

from deployments.backends.causal_lm import CausalLM
from deployments.backends.sampling import RowSampler, SamplingParams, sample_rows


@dataclass(frozen=True)
class EngineOutput:
    """What a sequence has so far: every generated token (EOS excluded), and whether it
    is over (`finished`), with `error` set when the engine failed it."""

    tokens: list[int]
    finished: bool
    hit_eos: bool = False
    error: str | None = None


OnOutput = Callable[[EngineOutput], None]


@dataclass(frozen=True)
class ContinuousSettings:
    max_batch_tokens: int = 256
    kv_cache_tokens: int = 16384
    page_size: int = 32
    scheduler: str = "fifo"
    max_num_seqs: int = 32
    torch_threads: int = 0  # 0 = torch's default


class _PerRequestSampler(ContinuousBatchingLogitsProcessor):
    supported_kwargs: dict[str, type] = {}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, torch_threads: int) -> None:
        self.samplers: dict[str, RowSampler] = {}
        self._rows: list[RowSampler | None] = []
        self._torch_threads = torch_threads
        self._threads_set = False

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
        self._rows = [self.samplers.get(r.state.request_id) for r in requests_with_new_token]
        return torch.zeros(len(self._rows), dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        return sample_rows(scores, self._rows[: scores.size(0)])


class ContinuousEngine:
    def __init__(self, lm: CausalLM, settings: ContinuousSettings) -> None:
        self.lm = lm
        self.settings = settings
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
        self.manager = lm.model.init_continuous_batching(
            generation_config=generation, continuous_batching_config=config
        )
        self._sampler = _PerRequestSampler(settings.torch_threads)
        processors = ContinuousBatchingLogitsProcessorList(LogitsProcessorList([self._sampler]))
        processors.tensors_required = 1  # one int32 row of arguments, unused by ours
        # Replaces the manager's (empty) list before its batch processor is created in start().
        self.manager.logit_processor = processors
        self._live: set[str] = set()
        self.cancelled = 0
        self.finished = 0
        self.generated_tokens = 0

    def start(self) -> None:
        self.manager.start()

    def stop(self) -> None:
        self.manager.stop(block=True, timeout=10)

    def submit(
        self,
        request_id: str,
        prompt: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        on_output: OnOutput,
    ) -> None:
        """Starts a sequence; `on_output` gets its progress on the running loop, one call
        per generated token and a last one with `finished`. Call from the event loop."""
        if not sampling.greedy:
            self._sampler.samplers[request_id] = RowSampler.of(sampling)
        eos = self.lm.eos_ids

        def deliver(output: Any) -> None:
            tokens = list(output.generated_tokens)
            finished = output.is_finished()
            hit_eos = bool(tokens) and tokens[-1] in eos
            if hit_eos:
                tokens = tokens[:-1]
            if finished and request_id in self._live:
                self._live.discard(request_id)
                self._sampler.samplers.pop(request_id, None)
                self.finished += 1
                self.generated_tokens += len(tokens)
            on_output(EngineOutput(tokens, finished, hit_eos, output.error))

        self.manager.register_result_handler(request_id, deliver)
        self._live.add(request_id)
        self.manager.add_request(
            list(prompt), request_id=request_id, max_new_tokens=max_new_tokens, streaming=True
        )

    def cancel(self, request_id: str) -> None:
        """Frees the sequence's slot and KV blocks at the manager's next step. No output
        follows a cancel, so its handler is removed here."""
        if request_id not in self._live:
            return  # finished already
        self.manager.cancel_request(request_id)
        router = self.manager.output_router
        with router._lock:  # the manager has no public way to drop a handler
            router.result_handlers.pop(request_id, None)
        self._live.discard(request_id)
        self._sampler.samplers.pop(request_id, None)
        self.cancelled += 1

    @property
    def running(self) -> int:
        return len(self._live)

    def stats(self) -> dict[str, Any]:
        return {
            "running_sequences": self.running,
            "finished_sequences": self.finished,
            "cancelled_sequences": self.cancelled,
            "generated_tokens": self.generated_tokens,
            "generation_thread_alive": self.manager.is_running(),
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
