"""CPU per single-text embedding request, by where it is spent.

    python -m bench.cost_budget [--runtime auto] [--duration 15] [--concurrency 64]
                                [--in-process 20000] [--in-process-only]

Two measures, printed as one table (the figures are CPU microseconds per request):

1. **In process, no server**: the ingress's own code, what it does per request of its own
   (parse, validate, authenticate, route, admit, coalesce, shape and encode the answer),
   through the same ASGI app Serve runs, with a model that answers at once. Requests go in
   groups of `--concurrency` at a time, as under load. Also through the FastAPI app alone,
   which is what the hot routes' front (deployments/http/hot_routes.py) saves.
2. **Live**: the default app (`serve_config.yaml`, `--runtime` for its embedder) under a
   closed loop of single-text requests; each process's CPU over the window, from /proc,
   divided by the requests answered: HAProxy; the ingress replica (its HTTP server and
   Serve's per-request wrapper, the route code, and the caller's half of the Ray hop); the
   embedding replica outside the forward pass (its event loop and Ray's threads: the
   callee's half of the hop, batching, tokenizing, metrics) and inside it (the model thread
   and the runtime's own threads); Ray's own processes; the load generator.

The goal of issue 27 for the ingress's own code is <= 100 us a request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from bench.loadgen import LoadResult, embedding_bodies, run_closed_loop
from bench.process_cpu import cpu_ticks
from bench.server import ROOT, descendants, load_config, running_server
from bench.texts import sentences
from deployments.core.gc_policy import relax_collector
from deployments.core.protocol import EmbedJob, EmbedResult, JobCall
from deployments.http.server import HttpIngress

MODEL = "all-MiniLM-L6-v2"
TICKS = os.sysconf("SC_CLK_TCK")
SETTLE_S = 10  # Ray keeps starting helper processes for a few seconds after healthy


# --- 1. In process -----------------------------------------------------------------


class _InstantEmbedder:
    """A deployment handle whose calls answer at once with unit vectors of the real
    model's size, so the JSON encoding costs what it costs for MiniLM."""

    def __init__(self, dim: int = 384) -> None:
        self._vector = np.full(dim, 1 / np.sqrt(dim), dtype=np.float32)

    def remote(self, call: JobCall[EmbedJob]) -> Any:
        """`handle.remote(call)`: the embedder's `__call__`."""
        return asyncio.ensure_future(self._embed(call.jobs))

    async def _embed(self, jobs: list[EmbedJob]) -> list[EmbedResult]:
        return [
            EmbedResult(
                np.tile(self._vector, (len(job.texts or []), 1)), [9] * len(job.texts or [])
            )
            for job in jobs
        ]


def _ingress_app(plain: bool) -> Any:
    config = copy.deepcopy(load_config())["applications"][0]["args"]
    config["rerank_models"], config["generation_models"] = [], []  # only the embedder

    async def ready() -> None:
        return None

    ingress = HttpIngress(config, embedders={MODEL: _InstantEmbedder()}, readiness=ready)
    relax_collector()  # as in a replica
    front = ingress.__serve_build_asgi_app__()
    return getattr(front, "app", front) if plain else front  # (a checkout before the front)


async def _one_request(app: Any, body: bytes) -> int:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/embeddings",
        "raw_path": b"/v1/embeddings",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # a client that stays: no disconnect
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def _in_process_us(app: Any, bodies: list[bytes], requests: int, group: int) -> float:
    for body in bodies[:200]:  # warm: imports, first-call caches
        await _one_request(app, body)
    done = 0
    started = time.process_time()
    while done < requests:
        statuses = await asyncio.gather(
            *(_one_request(app, bodies[(done + i) % len(bodies)]) for i in range(group))
        )
        if set(statuses) != {200}:
            raise RuntimeError(f"in-process requests answered {sorted(set(statuses))}")
        done += group
    return (time.process_time() - started) / done * 1e6


def in_process(requests: int, group: int) -> dict[str, float]:
    bodies = embedding_bodies(sentences(), 1, MODEL, 512)
    return {
        "front": asyncio.run(_in_process_us(_ingress_app(False), bodies, requests, group)),
        "fastapi": asyncio.run(_in_process_us(_ingress_app(True), bodies, requests, group)),
    }


# --- 2. Live -----------------------------------------------------------------------


def _process_groups(server_pid: int) -> dict[int, str]:
    """Every process the server started (not another Serve's on the machine): pid -> its
    group in the table."""
    groups: dict[int, str] = {}
    for pid in descendants(server_pid) | {server_pid}:
        entry = str(pid)
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "ServeReplica:" in cmdline and ":ingress" in cmdline:
            groups[int(entry)] = "ingress"
        elif "ServeReplica:" in cmdline and ":embed-" in cmdline:
            groups[int(entry)] = "embed"
        elif "ServeReplica:" in cmdline:
            groups[int(entry)] = "other model replicas (idle)"
        elif "haproxy" in cmdline and "-f " in cmdline:
            groups[int(entry)] = "HAProxy"
        else:
            groups[int(entry)] = "Ray (launcher, controller, raylet, GCS, agents)"
    return groups


@dataclass
class Sample:
    processes: dict[int, int]
    threads: dict[int, int]  # the embedding replica's threads


def _sample(groups: dict[int, str], embed_pid: int) -> Sample:
    processes = {}
    for pid in groups:
        try:
            processes[pid] = cpu_ticks(Path(f"/proc/{pid}/stat"))
        except OSError:
            processes[pid] = 0
    threads = {}
    for tid in os.listdir(f"/proc/{embed_pid}/task"):
        with contextlib.suppress(OSError):  # a thread that ended
            threads[int(tid)] = cpu_ticks(Path(f"/proc/{embed_pid}/task/{tid}/stat"))
    return Sample(processes, threads)


def _forward_threads(embed_pid: int, info: dict[str, Any]) -> set[int]:
    """The model thread and the runtime's pool: threads that are neither Python's nor
    named by Ray's or gRPC's C++ (those keep the process's name, `ray::...`)."""
    if "threads" not in info:  # a checkout whose replicas do not say: no split
        return set()
    python = set(info["threads"]["python"])
    forward = set(info["threads"].get("models") or [info["threads"]["model"]])
    if info["threads"].get("lane"):  # the realtime lane's thread runs passes too
        forward.add(info["threads"]["lane"])
    for tid in os.listdir(f"/proc/{embed_pid}/task"):
        with open(f"/proc/{embed_pid}/task/{tid}/comm") as comm:
            name = comm.read().strip()
        if int(tid) not in python and name.startswith("ray::"):
            forward.add(int(tid))
    return forward


def live(runtime: str, duration_s: float, concurrency: int) -> tuple[dict[str, float], LoadResult]:
    config = copy.deepcopy(load_config())
    for model in config["applications"][0]["args"]["embedding_models"]:
        model["runtime"] = runtime
    with tempfile.TemporaryDirectory() as workdir, running_server(config, Path(workdir)) as server:
        time.sleep(SETTLE_S)
        info = httpx.get(f"{server.url}/v1/stats", timeout=10).json()["models"][MODEL]["replica"]
        print(f"embedder runtime: {info.get('runtime', {}).get('runtime', runtime)}", flush=True)
        groups = _process_groups(server.process.pid)
        embed_pid = int(info["pid"])
        forward = _forward_threads(embed_pid, info)
        bodies = embedding_bodies(sentences(), 1, MODEL, 512)
        before_box: list[Sample] = []

        async def load() -> LoadResult:
            async def mark() -> None:
                await asyncio.sleep(2.0)  # the load's warm-up
                before_box.append(_sample(groups, embed_pid))

            marker = asyncio.create_task(mark())
            result = await run_closed_loop(
                "127.0.0.1",
                server.port,
                "/v1/embeddings",
                bodies,
                1,
                concurrency,
                duration_s,
                warmup_s=2.0,
                progress=False,
            )
            await marker
            return result

        result = asyncio.run(load())
        after = _sample(groups, embed_pid)
    before = before_box[0]
    # The window's own requests; the drain after it adds a little CPU, not requests.
    per_request = 1e6 / TICKS / max(result.requests, 1)
    table: dict[str, float] = {}
    for pid, group in groups.items():
        if group == "embed":
            continue
        used = after.processes.get(pid, 0) - before.processes.get(pid, 0)
        table[group] = table.get(group, 0.0) + used * per_request
    inside = sum(after.threads[t] - before.threads.get(t, 0) for t in forward if t in after.threads)
    whole = after.processes[embed_pid] - before.processes[embed_pid]
    if forward:
        table["embed: outside the forward pass"] = (whole - inside) * per_request
        table["embed: the forward pass"] = inside * per_request
    else:
        table["embed: the whole replica"] = whole * per_request
    table["load generator"] = result.client_cpu_s * 1e6 / max(result.requests, 1)
    return table, result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="auto")
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--in-process", type=int, default=20000, help="requests in process")
    parser.add_argument("--in-process-only", action="store_true")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    own = in_process(args.in_process, args.concurrency)
    print("| where | CPU us per single-text request |")
    print("|---|---|")
    print(f"| ingress route code, in process, through the hot routes' front | {own['front']:.0f} |")
    print(f"| the same through the FastAPI app alone | {own['fastapi']:.0f} |")
    if args.in_process_only:
        return
    table, result = live(args.runtime, args.duration, args.concurrency)
    for group, us in table.items():
        print(f"| live: {group} | {us:.0f} |")
    print(f"| live: all of the above | {sum(table.values()):.0f} |")
    print(
        f"\nlive load: {args.concurrency} clients x 1 text, {result.req_per_s:.0f} req/s, "
        f"p50 {result.p50_ms:.1f} ms, p99 {result.p99_ms:.1f} ms, {result.failures} failed"
    )
    print(orjson.dumps({"in_process": own, "live": table, "req_per_s": result.req_per_s}).decode())


if __name__ == "__main__":
    main()
