"""The GPU profile served by Ray Serve on one GPU machine: the `num_gpus` claims Ray granted,
the device and runtime each model replica reports, GPU memory per replica, one answer of
each kind, and what the served path sustains next to the bare model on the same card.

    python -m bench.gpu_serve [--model-dir DIR] [--llm-gpus 0.5] [--duration 15]

serve_config.gpu.yaml is written for a cluster: the generation model claims a whole card
and the embedder and the reranker a quarter each, 1.5 GPUs that one card never holds, so
the generation replica would wait for a second GPU forever. This renders the profile for
one card: the generation claim becomes `--llm-gpus`, everything else stays as the profile
says, and `--model-dir` may stand in for the embedding weights (the device machine's
upload limit: a copy stored in fp16). The launcher serves it in `--mode proxy`, Serve's
own proxy, as the profile runs on a cluster. With `--memory-fence F` the embedder runs
under `gpu_memory_fraction: F` and takes a burst of full-window texts: every request must
still be answered while its batches run out of memory and are split. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families

from bench.loadgen import embedding_bodies, run_closed_loop
from bench.server import ROOT, Server, load_config, running_server
from bench.texts import sentences
from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source

# (connections, texts per request): many single-text clients, and a few bulk ones.
LOADS = ((64, 1), (8, 32))
SERVE_CLASSES = ("ServeReplica:", "ServeController", "ProxyActor")


def one_card_config(
    model_dir: Path | None, llm_gpus: float, no_gpu: bool, fence: float | None = None
) -> dict[str, Any]:
    config = load_config(ROOT / "serve_config.gpu.yaml")
    args = config["applications"][0]["args"]
    if fence is not None:
        for model in args.get("embedding_models") or []:
            model["gpu_memory_fraction"] = fence
    for model in args.get("generation_models") or []:
        model["deployment"]["ray_actor_options"]["num_gpus"] = llm_gpus
    if no_gpu:  # the script itself, checked on a small machine without a GPU
        args["ingress"]["deployment"]["num_replicas"] = 1
        args["ingress"]["realtime_replica"] = False
        for key in ("ingress", "embedding_models", "rerank_models", "generation_models"):
            for model in [args[key]] if key == "ingress" else args.get(key) or []:
                model["deployment"]["ray_actor_options"] = {"num_cpus": 0.1, "num_gpus": 0}
    if model_dir is not None:
        for key in ("embedding_models", "rerank_models"):
            for model in args.get(key) or []:
                model["source"] = str(model_dir)
    config["http_options"] = {"host": "127.0.0.1"}
    return config


# Run apart: the launcher's Ray requires its token (~/.ray/auth_token) from every client,
# and Ray reads RAY_AUTH_MODE once, when it is first imported.
LIST_ACTORS = """
import json, sys
from ray.util.state import list_actors
actors = list_actors(address=sys.argv[1], detail=True, limit=1000)
print(json.dumps([
    {"class": a.class_name, "name": a.repr_name or a.name, "pid": a.pid,
     "resources": a.required_resources}
    for a in actors if a.state == "ALIVE" and a.class_name.startswith(tuple(sys.argv[2:]))
]))
"""


def replica_claims(server: Server) -> list[dict[str, Any]]:
    """Every live Serve actor with the resources Ray scheduled it with."""
    out = subprocess.run(
        [sys.executable, "-c", LIST_ACTORS, server.dashboard_url(), *SERVE_CLASSES],
        env={**os.environ, "RAY_AUTH_MODE": "token"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    claims: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return claims


def gpu_memory_by_pid() -> dict[int, int]:
    """MiB of GPU memory each process holds, as nvidia-smi reports it."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    used: dict[int, int] = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        if pid.strip().isdigit() and mib.strip().isdigit():
            used[int(pid)] = int(mib)
    return used


def replicas_as_reported(server: Server) -> dict[str, Any]:
    stats = httpx.get(f"{server.url}/v1/stats", timeout=30).json()
    return {
        name: {
            key: model.get("replica", {}).get(key)
            for key in ("device", "dtype", "runtime", "pid", "engine")
        }
        for name, model in stats["models"].items()
    }


def one_of_each(server: Server, names: dict[str, str]) -> dict[str, Any]:
    """One request per task, with what came back, so a wrong device shows as an error."""
    calls = {
        "embeddings": (
            "/v1/embeddings",
            {"model": names["embedding"], "input": ["GPUs batch well.", "So do CPUs."]},
        ),
        "rerank": (
            "/v1/rerank",
            {
                "model": names["rerank"],
                "query": "capital of France",
                "documents": ["Berlin is in Germany.", "Paris is the capital of France."],
            },
        ),
        "chat": (
            "/v1/chat/completions",
            {
                "model": names["generation"],
                "messages": [{"role": "user", "content": "hello there"}],
                "max_tokens": 16,
                "temperature": 0,
            },
        ),
    }
    answers: dict[str, Any] = {}
    for task, (path, body) in calls.items():
        started = time.perf_counter()
        response = httpx.post(f"{server.url}{path}", json=body, timeout=60)
        payload = response.json()
        answers[task] = {
            "status": response.status_code,
            "ms": round((time.perf_counter() - started) * 1000, 1),
            "summary": _summary(task, payload) if response.status_code == 200 else payload,
        }
    return answers


def _summary(task: str, payload: dict[str, Any]) -> Any:
    if task == "embeddings":
        return {"vectors": len(payload["data"]), "dimension": len(payload["data"][0]["embedding"])}
    if task == "rerank":
        return [(r["index"], round(r["relevance_score"], 4)) for r in payload["results"]]
    return {
        "text": payload["choices"][0]["message"]["content"],
        "completion_tokens": payload["usage"]["completion_tokens"],
    }


def served_loads(server: Server, model: str, duration_s: float) -> dict[str, Any]:
    texts = sentences(2000)
    results: dict[str, Any] = {}
    for connections, per_request in LOADS:
        result = asyncio.run(
            run_closed_loop(
                "127.0.0.1",
                server.port,
                "/v1/embeddings",
                embedding_bodies(texts, per_request, model, 256),
                per_request,
                connections,
                duration_s,
                warmup_s=3.0,
                progress=False,
            )
        )
        latencies = sorted(result.latencies_s) or [0.0]
        results[f"{connections}x{per_request}"] = {
            "texts_per_s": round(result.texts_per_s),
            "p50_ms": round(statistics.median(latencies) * 1000, 1),
            "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))] * 1000, 1),
            "failures": result.failures,
            "statuses": result.status_counts,
        }
    return results


def rejections_by_reason(server: Server) -> dict[str, float]:
    """Requests the ingress answered without a result since it started, by class and reason
    (`tributary_rejections`): a load's counts say 429, not whether it was shed, a full queue
    or a rate limit. The front door's refusals (HAProxy's, in --mode throughput) never reach
    the ingress and are not among them. Replicas hand their counts to Prometheus every few
    seconds, so the last seconds of the last load may be missing."""
    text = httpx.get(server.metrics_url, timeout=30).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ray_tributary_rejections_total":
                key = f"{sample.labels.get('priority')}/{sample.labels.get('reason')}"
                counts[key] = counts.get(key, 0.0) + sample.value
    return counts


def bare_texts_per_s(source: str, rounds: int = 5) -> dict[str, float]:
    """The same model on the same card, fp16 as `dtype: auto` serves it, no server."""
    embedder = SentenceEmbedder(resolve_model_source(source), device="cuda", dtype=torch.float16)
    inputs = [embedder.window.wrap(ids)[0] for ids in embedder.tokenize(sentences(512))]
    rates: dict[str, float] = {}
    for size in (1, 32, 64):
        groups = [inputs[i : i + size] for i in range(0, len(inputs) if size > 1 else 64, size)]
        embedder.embed(groups[0])
        speeds = []
        for _ in range(rounds):
            torch.cuda.synchronize()
            started = time.perf_counter()
            for group in groups:
                embedder.embed(group)
            speeds.append(sum(map(len, groups)) / (time.perf_counter() - started))
        rates[f"batch_{size}"] = round(statistics.median(speeds))
    return rates


def memory_faults(server: Server, model: str, requests: int) -> dict[str, Any]:
    """`requests` concurrent requests of one full-window text each: under a tight
    `gpu_memory_fraction` their batch runs out of memory, and every request must still be
    answered. Returns the statuses and what the replica counted."""
    text = " ".join(["tributary"] * 600)  # longer than the window: truncated to it

    async def send() -> list[int]:
        limits = httpx.Limits(max_connections=requests)
        async with httpx.AsyncClient(limits=limits, timeout=120) as client:
            responses = await asyncio.gather(
                *(
                    client.post(f"{server.url}/v1/embeddings", json={"model": model, "input": text})
                    for _ in range(requests)
                )
            )
        return [r.status_code for r in responses]

    statuses = asyncio.run(send())
    replica = httpx.get(f"{server.url}/v1/stats", timeout=30).json()["models"][model]["replica"]
    return {
        "statuses": {str(code): statuses.count(code) for code in sorted(set(statuses))},
        "memory": replica.get("memory"),
        "normal_max_batch_tokens": replica["plans"]["normal"]["max_batch_tokens"],
        "mean_batch_size": replica["mean_batch_size"],
    }


def with_gpu_memory(claims: list[dict[str, Any]]) -> list[dict[str, Any]]:
    memory = gpu_memory_by_pid()
    return [{**claim, "gpu_mib": memory.get(claim["pid"], 0)} for claim in claims]


def _attempt(measure: Any) -> Any:
    """One part of the report; a part that fails says why and the others still run."""
    try:
        return measure()
    except Exception as exc:  # a report of what failed is the point here
        return {"error": f"{type(exc).__name__}: {exc}"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=None)
    parser.add_argument("--llm-gpus", type=float, default=0.5)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument(
        "--no-gpu", action="store_true", help="claim no GPU: checks this script on a CPU machine"
    )
    parser.add_argument(
        "--mode",
        default="proxy",
        help="the launcher's --mode: proxy (Serve's proxy, as on a cluster) or throughput",
    )
    parser.add_argument(
        "--memory-fence",
        type=float,
        default=None,
        help="gpu_memory_fraction for the embedder, then a burst of full-window texts",
    )
    parser.add_argument("--skip-loads", action="store_true", help="no throughput loads")
    parser.add_argument("--log-copy", type=Path, default=None, help="keep the server's log here")
    args = parser.parse_args(argv)
    config = one_card_config(args.model_dir, args.llm_gpus, args.no_gpu, args.memory_fence)
    model_args = config["applications"][0]["args"]
    names = {
        task: model_args[f"{task}_models"][0]["name"]
        for task in ("embedding", "rerank", "generation")
    }
    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "llm_gpus": args.llm_gpus,
        "mode": args.mode,
    }
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory() as workdir,
        running_server(config, Path(workdir), mode=args.mode, startup_timeout_s=420) as server,
    ):
        report["ready_s"] = round(time.monotonic() - started, 1)
        try:
            report["actors"] = _attempt(lambda: with_gpu_memory(replica_claims(server)))
            report["replicas_report"] = _attempt(lambda: replicas_as_reported(server))
            report["answers"] = _attempt(lambda: one_of_each(server, names))
            if not args.skip_loads:
                report["served"] = _attempt(
                    lambda: served_loads(server, names["embedding"], args.duration)
                )
                report["rejections"] = _attempt(lambda: rejections_by_reason(server))
            if args.memory_fence is not None:
                report["memory_faults"] = _attempt(
                    lambda: memory_faults(server, names["embedding"], 256)
                )
            report["gpu_mib_after_load"] = _attempt(gpu_memory_by_pid)
        finally:
            if args.log_copy:
                shutil.copy(server.log, args.log_copy)
    if torch.cuda.is_available() and not args.skip_loads:
        source = str(args.model_dir or model_args["embedding_models"][0]["source"])
        report["bare_fp16"] = bare_texts_per_s(source)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
