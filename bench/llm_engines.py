"""The two generation engines without Serve: a closed burst of the LLM benchmark's mixed
requests through one batched `generate` (static) and through the continuous-batching
manager, in one process, one after the other. For tuning `ContinuousBatchingConfig` and
torch threads: the served benchmark (bench/llm.py) takes minutes per setting, this
seconds. Run it under py-spy to see where a manager step goes:

    py-spy record -r 200 -o /tmp/cb.svg -- \
        .venv/bin/python -m bench.llm_engines --engines continuous
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch

from bench.llm_workload import mixed_requests
from deployments.backends.generation.causal_lm import CausalLM, resolve_lm_source
from deployments.backends.generation.continuous import (
    ContinuousEngine,
    ContinuousSettings,
    EngineOutput,
)
from deployments.backends.generation.sampling import SamplingParams

GREEDY = SamplingParams(0.0)


def static_burst(lm: CausalLM, prompts: list[list[int]], limits: list[int]) -> tuple[int, float]:
    began = time.perf_counter()
    outputs = lm.generate(prompts, limits, [GREEDY] * len(prompts))
    return sum(len(o) for o in outputs), time.perf_counter() - began


async def continuous_burst(
    engine: ContinuousEngine, prompts: list[list[int]], limits: list[int]
) -> tuple[int, float]:
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in prompts]
    began = time.perf_counter()

    def done_with(future: asyncio.Future[EngineOutput]):  # type: ignore[no-untyped-def]
        def on_output(output: EngineOutput) -> None:
            if output.finished and not future.done():
                future.set_result(output)

        return on_output

    for i, (prompt, limit) in enumerate(zip(prompts, limits, strict=True)):
        engine.submit(f"burst-{i}-{began}", prompt, limit, GREEDY, done_with(futures[i]))
    results = await asyncio.gather(*futures)
    return sum(len(r.tokens) for r in results), time.perf_counter() - began


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engines", default="static,continuous")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-num-seqs", type=int, default=0, help="0: --requests")
    parser.add_argument("--max-batch-tokens", type=int, default=256)
    parser.add_argument("--kv-cache-tokens", type=int, default=16384)
    parser.add_argument("--page-size", type=int, default=32)
    parser.add_argument("--scheduler", default="fifo")
    parser.add_argument("--source", default="demo:tiny-llama")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = CausalLM(resolve_lm_source(args.source))
    work = mixed_requests(args.requests, seed=0)
    prompts = [lm.prompt_ids(r.prompt) for r in work]
    limits = [r.max_tokens for r in work]
    engines = args.engines.split(",")
    engine = None
    if "continuous" in engines:
        settings = ContinuousSettings(
            max_batch_tokens=args.max_batch_tokens,
            kv_cache_tokens=args.kv_cache_tokens,
            page_size=args.page_size,
            scheduler=args.scheduler,
            max_num_seqs=args.max_num_seqs or args.requests,
            torch_threads=args.threads,
        )
        engine = ContinuousEngine(lm, settings)
        engine.start()
        asyncio.run(continuous_burst(engine, prompts[:2], [4, 4]))  # warm up
    static_burst(lm, prompts[:2], [4, 4])
    try:
        for round_ in range(args.rounds):
            for name in engines:
                if name == "static":
                    tokens, seconds = static_burst(lm, prompts, limits)
                else:
                    assert engine is not None
                    tokens, seconds = asyncio.run(continuous_burst(engine, prompts, limits))
                print(
                    f"round {round_ + 1} {name}: {tokens} tokens in {seconds:.2f} s = "
                    f"{tokens / seconds:.0f} tokens/s",
                    flush=True,
                )
    finally:
        if engine is not None:
            engine.stop()


if __name__ == "__main__":
    main()
