"""The static engine, kept to show what continuous batching buys: `@serve.batch` gathers
up to `max_num_seqs` requests and runs them through one batched `generate`; a request that
arrives meanwhile waits for the whole batch to end, and every row of a batch costs a step
until its longest row is done.

It streams anyway: the batched method is an async generator that yields, at every decoding
step, one entry per request (its new token, or StopIteration once it has finished), which
Serve hands to each caller. It offers the same `submit`/`cancel` as the continuous engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ray import serve

from deployments.backends.generation.causal_lm import CausalLM
from deployments.backends.generation.continuous import EngineOutput, OnOutput
from deployments.backends.generation.sampling import SamplingParams


@dataclass(eq=False)
class _Row:
    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    cancelled: bool = False
    tokens: list[int] = field(default_factory=list)
    error: str | None = None  # set on the model thread when this row alone failed


# Ray's stubs for serve.batch cover neither a method that streams (an async generator) nor
# the set_* methods on what it returns; through this name the decorated method is Any.
_streaming_batch: Callable[[Callable[..., Any]], Any] = serve.batch(
    max_batch_size=32, batch_wait_timeout_s=0.01
)


class StaticEngine:
    def __init__(
        self, lm: CausalLM, executor: ThreadPoolExecutor, max_num_seqs: int, wait_s: float
    ):
        self.lm = lm
        self._executor = executor
        self._rows: dict[str, _Row] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._batch.set_max_batch_size(max_num_seqs)
        self._batch.set_batch_wait_timeout_s(wait_s)
        self.cancelled = 0
        self.finished = 0
        self.generated_tokens = 0
        self.batches = 0

    def submit(
        self,
        request_id: str,
        prompt: Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams,
        on_output: OnOutput,
    ) -> None:
        row = _Row(list(prompt), max_new_tokens, sampling)
        self._rows[request_id] = row
        task = asyncio.get_running_loop().create_task(self._follow(request_id, row, on_output))
        self._tasks[request_id] = task

    async def _follow(self, request_id: str, row: _Row, on_output: OnOutput) -> None:
        try:
            async for token in self._batch(row):
                if token is None:
                    continue
                row.tokens.append(token)
                on_output(EngineOutput(list(row.tokens), False))
            if row.error is not None:
                on_output(EngineOutput(list(row.tokens), True, error=row.error))
                return
            hit_eos = len(row.tokens) < row.max_new_tokens
            self.finished += 1
            self.generated_tokens += len(row.tokens)
            on_output(EngineOutput(list(row.tokens), True, hit_eos))
        except Exception as exc:
            on_output(EngineOutput(list(row.tokens), True, error=repr(exc)))
        finally:
            self._rows.pop(request_id, None)
            self._tasks.pop(request_id, None)

    def cancel(self, request_id: str) -> None:
        row = self._rows.pop(request_id, None)
        if row is not None:
            row.cancelled = True  # its batch forces EOS on the row at the next step
            self.cancelled += 1
            task = self._tasks.pop(request_id, None)
            if task is not None:
                task.cancel()

    @property
    def alive(self) -> bool:
        # No thread of its own to lose: a failing batch fails its rows, and the next runs.
        return True

    def stats(self) -> dict[str, Any]:
        return {
            "running_sequences": len(self._rows),
            "finished_sequences": self.finished,
            "cancelled_sequences": self.cancelled,
            "generated_tokens": self.generated_tokens,
            "batches": self.batches,
        }

    @_streaming_batch
    async def _batch(self, rows: list[_Row]) -> AsyncIterator[list[Any]]:
        self.batches += 1
        loop = asyncio.get_running_loop()
        steps: asyncio.Queue[list[int | None] | None] = asyncio.Queue()

        def on_step(tokens: list[int | None]) -> None:  # on the model thread
            loop.call_soon_threadsafe(steps.put_nowait, tokens)

        def run() -> None:
            try:
                self.lm.generate(
                    [r.prompt for r in rows],
                    [r.max_new_tokens for r in rows],
                    [r.sampling for r in rows],
                    on_step=on_step,
                    cancelled=lambda i: rows[i].cancelled,
                    on_error=lambda i, message: setattr(rows[i], "error", message),
                )
            finally:
                loop.call_soon_threadsafe(steps.put_nowait, None)

        done = loop.run_in_executor(self._executor, run)
        counts = [0] * len(rows)
        finished = [False] * len(rows)
        while (step := await steps.get()) is not None:
            out: list[Any] = []
            for i, token in enumerate(step):
                if finished[i] or token is None:
                    finished[i] = True
                    out.append(StopIteration)  # ends this caller's stream
                else:
                    out.append(token)
                    counts[i] += 1
            yield out
            # A row at its limit ends now, not one step later.
            for i, row in enumerate(rows):
                finished[i] = finished[i] or counts[i] >= row.max_new_tokens
        await done  # raises the model's error, which fails every row of the batch
