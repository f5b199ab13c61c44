"""The real continuous engine on the demo model, no Ray: a sequence that fails in the
sampler fails alone while the others go on unchanged, and a dead engine fails every
sequence at once, refuses new ones, and is back after an in-process restart."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import torch

from deployments.backends.generation.causal_lm import CausalLM, resolve_lm_source
from deployments.backends.generation.continuous import (
    ContinuousEngine,
    ContinuousSettings,
    EngineDown,
    EngineOutput,
    first_output,
)
from deployments.backends.generation.sampling import RowSampler, SamplingParams

GREEDY = SamplingParams(0.0)
POISON_SEED = 666  # the one request whose sampler raises


class PoisonSampler(RowSampler):
    def draw(self, logits: torch.Tensor) -> int:
        if self.params.seed == POISON_SEED:
            raise ValueError("poisoned row")
        return super().draw(logits)


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> CausalLM:
    return CausalLM(resolve_lm_source("demo:tiny-llama", tmp_path_factory.mktemp("cache")))


@pytest.fixture
async def engine(lm: CausalLM):
    settings = ContinuousSettings(max_num_seqs=4, kv_cache_tokens=4096)
    engine = ContinuousEngine(lm, settings, row_sampler=PoisonSampler.of)
    engine.start()
    yield engine
    engine.stop()


async def until(condition: Callable[[], bool], timeout_s: float) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)


class Outputs:
    """One sequence's outputs, and an event when its last one came."""

    def __init__(self) -> None:
        self.all: list[EngineOutput] = []
        self.done = asyncio.Event()

    def __call__(self, output: EngineOutput) -> None:
        self.all.append(output)
        if output.finished:
            self.done.set()

    @property
    def last(self) -> EngineOutput:
        return self.all[-1]


async def test_a_poisoned_row_fails_alone_and_the_others_are_unchanged(
    lm: CausalLM, engine: ContinuousEngine
) -> None:
    prompt = lm.chat_ids([{"role": "user", "content": "the old bridge"}])
    expected = lm.generate([prompt], [40], [GREEDY])[0]
    greedy, poisoned, sampled = Outputs(), Outputs(), Outputs()
    engine.submit("greedy", prompt, 40, GREEDY, greedy)
    engine.submit("poison", prompt, 40, SamplingParams(0.8, seed=POISON_SEED), poisoned)
    engine.submit("sampled", prompt, 40, SamplingParams(0.8, seed=1), sampled)
    for outputs in (greedy, poisoned, sampled):
        await asyncio.wait_for(outputs.done.wait(), 60)
    assert poisoned.last.error == "sampling failed: ValueError"
    assert not poisoned.last.engine_down and len(poisoned.all) == 1
    assert greedy.last.error is None and greedy.last.tokens == expected
    assert sampled.last.error is None and sampled.last.finished
    assert engine.alive and engine.stats()["failed_sequences"] == 1
    assert engine.running == 0
    again = await asyncio.wait_for(first_output(engine, prompt, 40), 60)
    assert again.tokens == expected  # the engine serves on


async def test_hostile_sampling_values_do_not_stop_the_engine(
    lm: CausalLM, engine: ContinuousEngine
) -> None:
    prompt = lm.prompt_ids("the city by the sea")
    expected = lm.generate([prompt], [16], [GREEDY])[0]
    hostile = [
        SamplingParams(1e-39, 1.0, 1),
        SamplingParams(5e-324, 1e-300, 2**64 - 1),
        SamplingParams(1.0, 1e-300, 0),
        SamplingParams(2.0, 5e-324, 2**64 + 5),
        SamplingParams(1e-300, 1e-39, -1),
    ]
    seen = [Outputs() for _ in hostile]
    for i, (params, outputs) in enumerate(zip(hostile, seen, strict=True)):
        engine.submit(f"h{i}", prompt, 16, params, outputs)
    for outputs in seen:
        await asyncio.wait_for(outputs.done.wait(), 60)
        assert outputs.last.error is None
    # A temperature that small, or a top-p that small, is greedy decoding.
    for outputs in (seen[0], seen[1], seen[2], seen[4]):
        assert outputs.last.tokens == expected
    assert engine.alive


async def test_a_dead_engine_fails_everything_at_once_and_restarts(
    lm: CausalLM, engine: ContinuousEngine
) -> None:
    prompt = lm.chat_ids([{"role": "user", "content": "the old bridge"}])
    expected = lm.generate([prompt], [24], [GREEDY])[0]

    def crash(request_id: str, error: Exception) -> None:
        raise RuntimeError("the step itself fails")  # escapes into the manager's loop

    engine._sampler._on_row_error = crash
    victim = Outputs()
    engine.submit("victim", prompt, 400, GREEDY, victim)
    await asyncio.sleep(0.2)
    engine.submit("poison", prompt, 40, SamplingParams(0.8, seed=POISON_SEED), Outputs())
    died = time.monotonic()
    await asyncio.wait_for(victim.done.wait(), 5)
    assert victim.last.error is not None and victim.last.engine_down
    await until(lambda: not engine.manager.is_running(), 5)  # its thread winds down
    assert not engine.alive
    with pytest.raises(EngineDown):
        engine.submit("late", prompt, 4, GREEDY, Outputs())
    assert engine.check() and engine.alive  # a new manager over the loaded model
    back = time.monotonic() - died
    assert engine.stats()["engine_restarts"] == 1 and engine.last_restart_s is not None
    assert back < 5, f"generation was down {back:.2f} s"
    after = await asyncio.wait_for(first_output(engine, prompt, 24), 60)
    assert after.tokens == expected


async def test_the_watchdog_notices_a_dead_engine_by_itself(
    lm: CausalLM, engine: ContinuousEngine
) -> None:
    watchdog = asyncio.create_task(engine.watch(0.05))
    try:
        prompt = lm.prompt_ids("the city")
        stream = Outputs()
        engine.submit("long", prompt, 400, GREEDY, stream)
        await asyncio.sleep(0.1)
        engine.drill_failure()  # the thread ends, not through engine.stop
        await asyncio.wait_for(stream.done.wait(), 2)
        assert stream.last.engine_down
        await until(lambda: engine.alive, 3)
        assert engine.alive and engine.restarts == 1
        done = await asyncio.wait_for(first_output(engine, prompt, 8), 60)
        assert done.finished and done.error is None
    finally:
        watchdog.cancel()


def test_static_batch_a_poisoned_row_ends_alone(
    lm: CausalLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    import deployments.backends.generation.causal_lm as causal_lm

    monkeypatch.setattr(causal_lm, "RowSampler", PoisonSampler)
    prompt = lm.prompt_ids("the city")
    expected = lm.generate([prompt], [12], [GREEDY])[0]
    errors: list[tuple[int, str]] = []
    poison = SamplingParams(0.8, seed=POISON_SEED)
    out = lm.generate([prompt, prompt], [12, 12], [GREEDY, poison], on_error=_append(errors))
    assert out[0] == expected and out[1] == []
    assert errors == [(1, "sampling failed: ValueError")]


def _append(into: list[tuple[int, str]]) -> Callable[[int, str], None]:
    return lambda row, message: into.append((row, message))
