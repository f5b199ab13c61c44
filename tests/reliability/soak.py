"""`make soak`: the default app (with the result cache on a Redis of its own) under a mixed
load of about 1.5x its capacity for SOAK_MINUTES (default 60): embeddings in every class,
rerank, streamed and whole generations, clients that leave early. Along the way the
generation model's replica is killed (at 40 % of the run) and Redis is restarted (at 70 %).

Every minute it prints, per stream, the answered latencies, refusals and unanswered
requests, and the RSS of every process of the server; at the end it checks the goals
(issue 31): 0 unanswered, every refusal with Retry-After, no status but 200/429/503, the
RSS of each process grown by at most 20 MiB from minute 5 to the end (from the first
minute in a run of 5 minutes or less), and each fault recovered within 10 s. The figures
go to bench/results/soak-YYYYmmdd-HHMMSS.json; the exit status says whether the goals held.

    SOAK_MINUTES=3 python -m tests.reliability.soak

SOAK_CONFIG names another serve config of the same shape (e.g. a copy of serve_config.yaml
with two replicas of the generation model) to soak in place of the default app.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.loadgen import embedding_bodies, run_closed_loop
from bench.server import Server, descendants, load_config, running_server
from bench.texts import sentences
from tests.reliability.memory_map import rss_by_kind
from tests.reliability.procs import cmdline, realtime_ingress_pid, rss_mib
from tests.reliability.replica_kill import KillRun
from tests.reliability.report import RESULTS_DIR
from tests.reliability.soak_faults import (
    Redis,
    cache_probe,
    cache_recovery_s,
    generation_probe,
    kill_recovery_s,
    kill_replica,
)
from tests.reliability.soak_load import GenerationClients, LeavingEmbeds, OpenStream, Tally

LOAD = 1.5  # x the measured capacity, in the embeddings' own terms
TEXTS = 4  # per embedding request: keeps the load generator's CPU off the server's cores
MINUTE_S = 60.0
RSS_GROWTH_MIB = 20
RSS_FROM_MINUTE = 5
RECOVERY_S = 10


def rerank_body(model: str, k: int) -> bytes:
    documents = [f"document {k}-{d} about {s}" for d, s in enumerate(sentences(8, seed=k))]
    return json.dumps({"model": model, "query": f"query {k}", "documents": documents}).encode()


def fresh_bodies(model: str, texts: int, requests: int, tag: str) -> list[bytes]:
    """`requests` bodies of `texts` texts each, no text like any other: every one a cache
    miss (the cache is on, and a repeated text would cost the model nothing)."""
    base = sentences(2000)
    unique = [f"{base[i % len(base)]} ({tag} {i})" for i in range(texts * max(requests, 1))]
    return embedding_bodies(unique, texts, model, max(requests, 1))


def streams(models: dict[str, str], capacity: float, minute: int) -> list[Any]:
    embedder, reranker, llm = models["embedding"], models["rerank"], models["generation"]
    rate = LOAD * capacity
    per_minute = int(MINUTE_S * rate) + 1
    # The batch class sends the same 200 texts all along: it hits the cache (on Redis),
    # and the texts need Redis back after its restart to be hits again.
    again = embedding_bodies(sentences(200, seed=7), TEXTS, embedder, 50)
    return [
        OpenStream("embed normal", "/v1/embeddings",
                   fresh_bodies(embedder, TEXTS, per_minute, f"n{minute}"), 0.8 * rate, "normal"),
        OpenStream("embed batch", "/v1/embeddings", again, 0.3 * rate, "batch"),
        OpenStream("embed realtime", "/v1/embeddings",
                   fresh_bodies(embedder, 1, 1200, f"r{minute}"), min(0.1 * rate, 20), "realtime"),
        OpenStream("rerank normal", "/v1/rerank",
                   [rerank_body(reranker, minute * 100 + k) for k in range(50)],
                   max(1.0, 0.02 * rate), "normal"),
        GenerationClients("chat streamed", llm, 2, stream=True, priority="normal"),
        GenerationClients("chat whole", llm, 2, stream=False, priority="batch"),
        GenerationClients("chat leaving", llm, 1, stream=True, priority="realtime", leave=True),
        LeavingEmbeds("embed leaving", fresh_bodies(embedder, 1, 300, f"l{minute}"), 5.0),
    ]  # fmt: skip


def labelled_pids(server: Server, extra: dict[str, int]) -> dict[str, int]:
    """The server's processes by label (the pid added where two share a name), `extra` too."""
    pids = {pid: _label(cmdline(pid)) for pid in descendants(server.process.pid)}
    pids.update({pid: name for name, pid in extra.items()})
    found: dict[str, int] = {}
    for pid, name in sorted(pids.items()):
        found[name if name not in found else f"{name} ({pid})"] = pid
    return found


def rss_by_process(pids: dict[str, int]) -> dict[str, float]:
    found: dict[str, float] = {}
    for name, pid in pids.items():
        mib = rss_mib(pid)
        if mib is not None and mib > 1:
            found[name] = round(mib, 1)
    return found


def replicas_by_kind(pids: dict[str, int]) -> dict[str, dict[str, float]]:
    """Each Serve replica's resident memory by kind of mapping (memory_map.py)."""
    found = {}
    for name, pid in pids.items():
        kinds = rss_by_kind(pid) if "ServeReplica:" in name else None
        if kinds is not None:
            found[name] = kinds
    return found


def _label(command: str) -> str:
    words = command.split()
    for word in words:
        if word.startswith(("ServeReplica:", "ServeController", "ProxyActor")):
            return word
    if not words:
        return "?"
    name = Path(words[0]).name
    module = next((w for w in words[1:] if w.endswith(".py")), None)
    return f"{name} {Path(module).name}" if module and name.startswith("python") else name


def realtime_ingress(server: Server) -> dict[str, int]:
    """The ingress replica kept for realtime, labelled by its role so that its RSS reads
    apart from the other's; empty when there is no such replica."""
    kept = realtime_ingress_pid(server)
    return {} if kept is None else {f"{_label(cmdline(kept))} (realtime)": kept}


def served_models(server: Server) -> dict[str, str]:
    listed = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"]
    return {entry["task"]: entry["id"] for entry in listed}


async def soak(server: Server, redis: Redis, minutes: int) -> dict[str, Any]:
    models = await asyncio.to_thread(served_models, server)
    calibration = fresh_bodies(models["embedding"], TEXTS, 20_000, "calibration")
    closed = await run_closed_loop(
        "127.0.0.1", server.port, "/v1/embeddings", calibration, TEXTS, 64, 10,
        warmup_s=2, progress=False, honor_retry_after=True,
    )  # fmt: skip
    capacity = closed.req_per_s
    stop = asyncio.Event()
    kill_run, hits = KillRun(), []
    probes = [
        asyncio.create_task(generation_probe(server, models["generation"], kill_run, stop)),
        asyncio.create_task(cache_probe(server, models["embedding"], hits, stop)),
    ]
    start = time.monotonic()
    faults: dict[str, Any] = {}

    async def inject() -> None:
        await asyncio.sleep(0.4 * minutes * MINUTE_S)
        pid, kill_run.killed_at = await asyncio.to_thread(
            kill_replica, server, models["generation"]
        )
        faults["replica_kill"] = {"pid": pid, "at_s": round(kill_run.killed_at - start, 1)}
        await asyncio.sleep(max(0.0, start + 0.7 * minutes * MINUTE_S - time.monotonic()))
        down = await asyncio.to_thread(redis.restart)
        faults["redis_restart"] = {"at_s": round(down - start, 1), "down": down}

    roles = await asyncio.to_thread(realtime_ingress, server)
    injector = asyncio.create_task(inject())
    per_minute: list[dict[str, Any]] = []
    totals: dict[str, Tally] = {}
    for minute in range(1, minutes + 1):
        load = streams(models, capacity, minute)
        tallies = await asyncio.gather(*(s.minute(server, MINUTE_S) for s in load))
        redis_pid = redis.process.pid if redis.process else 0  # a new one after its restart
        pids = labelled_pids(server, {"redis-server": redis_pid, **roles})
        rss = rss_by_process(pids)
        entry = {
            "minute": minute,
            "at_s": round(time.monotonic() - start, 1),
            "streams": {s.name: t.figures() for s, t in zip(load, tallies, strict=True)},
            "rss_mib": rss,
            "replica_rss_by_kind_mib": replicas_by_kind(pids),
        }
        per_minute.append(entry)
        print(json.dumps(entry, default=str), flush=True)
        for s, t in zip(load, tallies, strict=True):
            total = totals.setdefault(s.name, Tally())
            total.latencies_s += t.latencies_s
            total.refusals += t.refusals
            total.refusals_without_retry_after += t.refusals_without_retry_after
            total.unanswered += t.unanswered
            total.left += t.left
            for status, n in t.other.items():
                total.other[status] = total.other.get(status, 0) + n
            for status, body in t.other_bodies.items():
                total.other_bodies.setdefault(status, body)
    await injector
    stop.set()
    await asyncio.gather(*probes)
    down = faults.get("redis_restart", {}).pop("down", None)
    faults.setdefault("replica_kill", {})["recovery_s"] = kill_recovery_s(kill_run)
    faults.setdefault("redis_restart", {})["recovery_s"] = (
        None if down is None else cache_recovery_s(hits, down)
    )
    return {
        "capacity_req_per_s": round(capacity, 1),
        "texts_per_embedding_request": TEXTS,
        "minutes": minutes,
        "faults": faults,
        "totals": {name: t.figures() for name, t in totals.items()},
        "per_minute": per_minute,
    }


def goals(result: dict[str, Any]) -> list[str]:
    """What failed, one line each; empty when every goal held."""
    failed = []
    for name, figures in result["totals"].items():
        if figures["unanswered"]:
            failed.append(f"{name}: {figures['unanswered']} unanswered")
        if figures["refused_without_retry_after"]:
            failed.append(f"{name}: refusals without Retry-After")
        if figures["other_statuses"]:
            failed.append(f"{name}: statuses {figures['other_statuses']}")
    minutes = result["per_minute"]
    base = minutes[RSS_FROM_MINUTE - 1] if len(minutes) > RSS_FROM_MINUTE else minutes[0]
    last = minutes[-1]["rss_mib"]
    growth = {
        name: round(last[name] - mib, 1) for name, mib in base["rss_mib"].items() if name in last
    }
    result["rss_growth_mib"] = {
        "from_minute": base["minute"],
        "growth": growth,
        "replicas_by_kind": kind_growth(base, minutes[-1]),
    }
    grown = {name: g for name, g in growth.items() if g > RSS_GROWTH_MIB}
    if grown:
        failed.append(f"RSS grew more than {RSS_GROWTH_MIB} MiB: {grown}")
    for fault, figures in result["faults"].items():
        recovery = figures.get("recovery_s")
        if recovery is None or recovery > RECOVERY_S:
            failed.append(f"{fault}: recovered after {recovery} s (goal {RECOVERY_S} s)")
    return failed


def kind_growth(base: dict[str, Any], last: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Each replica's growth by kind of mapping, between two minutes' figures."""
    before, after = base["replica_rss_by_kind_mib"], last["replica_rss_by_kind_mib"]
    return {
        name: {kind: round(after[name][kind] - mib, 1) for kind, mib in kinds.items()}
        for name, kinds in before.items()
        if name in after
    }


def main() -> int:
    minutes = int(os.environ.get("SOAK_MINUTES", "60"))
    with tempfile.TemporaryDirectory(prefix="tributary-soak-") as scratch:
        workdir = Path(scratch)
        redis = Redis(workdir)
        redis.start()
        try:
            other = os.environ.get("SOAK_CONFIG")
            config = load_config(Path(other)) if other else load_config()
            config["applications"][0]["args"]["ingress"]["admission"]["predict_wait"] = True
            config["applications"][0]["args"]["cache"] = {
                "enabled": True,
                "backend": "redis",
                "url": redis.url,
            }
            try:
                with running_server(config, workdir) as server:
                    result = asyncio.run(soak(server, redis, minutes))
            finally:
                # The server's log outlives the scratch directory: a failed goal's story.
                RESULTS_DIR.mkdir(parents=True, exist_ok=True)
                log = workdir / "serve.log"
                if log.exists():
                    (RESULTS_DIR / time.strftime("soak-%Y%m%d-%H%M%S.log")).write_bytes(
                        log.read_bytes()
                    )
        finally:
            redis.stop()
    failed = goals(result)
    result["failed"] = failed
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / time.strftime("soak-%Y%m%d-%H%M%S.json")
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "per_minute"}, indent=2))
    print(f"report: {path}")
    print("soak: every goal held" if not failed else "soak FAILED:\n  " + "\n  ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
