"""The demo causal LM, static `generate` and the continuous engine, on the CPU, no Ray."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from deployments.backends.generation.causal_lm import CausalLM, resolve_lm_source
from deployments.backends.generation.continuous import (
    ContinuousEngine,
    ContinuousSettings,
    EngineOutput,
    first_output,
)
from deployments.backends.generation.demo_llm import CONTEXT_WINDOW
from deployments.backends.generation.sampling import SamplingParams

GREEDY = SamplingParams(0.0)


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> CausalLM:
    path = resolve_lm_source("demo:tiny-llama", tmp_path_factory.mktemp("cache"))
    return CausalLM(path)


def test_demo_model_is_built_once_and_loaded_like_a_checkpoint(lm: CausalLM) -> None:
    assert (lm.path / "config.json").is_file() and (lm.path / "DEMO_WEIGHTS.txt").is_file()
    assert resolve_lm_source("demo:tiny-llama", lm.path.parent) == lm.path
    assert lm.context_window == CONTEXT_WINDOW
    assert lm.has_chat_template
    ids = lm.chat_ids([{"role": "user", "content": "the river"}])
    assert lm.tokenizer.convert_ids_to_tokens(ids)[-1] == "<|assistant|>"
    assert lm.decode(lm.prompt_ids("the river runs")) == "the river runs"


def test_static_rows_stop_at_their_own_limits_and_match_a_single_run(lm: CausalLM) -> None:
    a, b = lm.prompt_ids("the city"), lm.prompt_ids("a long time ago in the north")
    alone = lm.generate([a], [12], [GREEDY])[0]
    together = lm.generate([a, b], [12, 5], [GREEDY, GREEDY])
    assert together[0] == alone  # left padding does not change a row's greedy tokens
    assert [len(t) for t in together] == [12, 5]


def test_seeded_sampling_repeats_and_differs_by_seed(lm: CausalLM) -> None:
    prompt = lm.prompt_ids("the city")
    draw = [SamplingParams(1.0, 0.95, seed=7)]
    first, again = lm.generate([prompt], [16], draw), lm.generate([prompt], [16], draw)
    other = lm.generate([prompt], [16], [SamplingParams(1.0, 0.95, seed=8)])
    assert first == again and first != other


def test_static_cancel_ends_a_row_early(lm: CausalLM) -> None:
    prompt = lm.prompt_ids("the city")
    steps: list[list[int | None]] = []
    out = lm.generate([prompt, prompt], [20, 20], [GREEDY, GREEDY], steps.append, lambda i: i == 1)
    assert len(out[0]) == 20 and out[1] == []


async def test_continuous_greedy_equals_static_generate_and_cancel_frees(lm: CausalLM) -> None:
    engine = ContinuousEngine(lm, ContinuousSettings(max_num_seqs=4, kv_cache_tokens=4096))
    engine.start()
    try:
        prompt = lm.chat_ids([{"role": "user", "content": "the old bridge"}])
        expected = lm.generate([prompt], [24], [GREEDY])[0]
        done = await first_output(engine, prompt, 24)
        assert done.finished and done.tokens == expected
        seen: list[EngineOutput] = []
        started = asyncio.Event()

        def on_output(output: EngineOutput) -> None:
            seen.append(output)
            started.set()

        engine.submit("long", prompt, 400, GREEDY, on_output)
        await asyncio.wait_for(started.wait(), 30)
        assert engine.stats()["running_sequences"] == 1
        engine.cancel("long")
        stats = engine.stats()
        assert stats["running_sequences"] == 0 and stats["cancelled_sequences"] == 1
        count = len(seen)
        await asyncio.sleep(0.3)
        assert len(seen) == count  # nothing is delivered after the cancel
    finally:
        engine.stop()


def test_unknown_demo_model_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown demo model"):
        resolve_lm_source("demo:nope", tmp_path)


async def test_stray_outputs_that_come_after_a_cancel_are_dropped_not_kept(lm: CausalLM) -> None:
    engine = ContinuousEngine(lm, ContinuousSettings(max_num_seqs=8, kv_cache_tokens=8192))
    engine.start()
    try:
        prompt = lm.chat_ids([{"role": "user", "content": "a river runs"}])
        left = engine.manager.output_router.output_queue
        for round_ in range(5):
            started = [asyncio.Event() for _ in range(8)]
            for i, event in enumerate(started):
                engine.submit(f"r{round_}-{i}", prompt, 400, GREEDY, lambda _, e=event: e.set())
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
            for i in range(8):  # clients leaving mid-stream, while the manager steps
                engine.cancel(f"r{round_}-{i}")
            await asyncio.sleep(0.1)
        strays = left.qsize()
        engine.check()  # what the watchdog does every period
        assert left.qsize() == 0
        assert engine.stats()["stray_outputs_dropped"] == strays
    finally:
        engine.stop()
