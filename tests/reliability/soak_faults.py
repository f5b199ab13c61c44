"""The soak's faults and what watches them: a Redis server of its own (the result cache's
backend) that it restarts, a model replica it kills, and probes that time the recovery
from each."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx

from bench.server import Server, free_port
from tests.redis_server import start_redis
from tests.reliability.procs import owned
from tests.reliability.replica_kill import KillRun, chat_body, closed_loop, replica_pid

RECOVERED_STREAK = 5


# Sized as docs/operations.md tells an operator to size a cache's Redis: a bound and LRU
# eviction. Unbounded, it held every new text's vector (~18 MiB a minute at the soak's
# rates), which the soak's RSS goal then read as growth.
REDIS_BOUND = ("--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru")


class Redis:
    """redis-server on a free port, nothing saved: a restart starts it empty."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("the soak needs redis-server (`sudo make redis`)")
        self.binary, self.workdir = binary, workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = start_redis(self.binary, self.port, self.workdir, *REDIS_BOUND)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)

    def restart(self) -> float:
        """Kills it (SIGKILL, as a crash) and starts it again; returns when it went down."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        down = time.monotonic()
        self.start()
        return down


def kill_replica(server: Server, model: str) -> tuple[int, float]:
    pid = replica_pid(server.url, model)
    if not owned(server, pid):
        raise RuntimeError(f"pid {pid} is not one of this server's processes")
    os.kill(pid, signal.SIGKILL)
    return pid, time.monotonic()


async def generation_probe(server: Server, model: str, run: KillRun, stop: asyncio.Event) -> None:
    """One client of short completions for the whole soak, timed (replica_kill.py)."""
    body = chat_body(model, max_tokens=4)
    headers = {"X-Request-Timeout": "10", "X-Priority": "realtime"}
    async with httpx.AsyncClient(timeout=40) as client:
        await closed_loop(client, run, f"{server.url}/v1/chat/completions", body, headers, stop)


async def cache_probe(
    server: Server, model: str, hits: list[tuple[float, bool]], stop: asyncio.Event
) -> None:
    """Twice the same new text every half second: the second answer comes from the
    cache while Redis works. Records (when, whether it hit).

    Realtime, as the generation probe: the soak holds the normal class at 1.5x capacity,
    where most of its requests are refused, and a refused first request writes nothing to
    the cache; a normal-class probe timed admission's luck, not Redis's return."""
    k = 0
    headers = {"X-Priority": "realtime"}
    async with httpx.AsyncClient(timeout=10, headers=headers) as client:
        while not stop.is_set():
            k += 1
            body = {"model": model, "input": f"cache probe {k} {time.time()}"}
            try:
                for _ in range(2):
                    answer = await client.post(f"{server.url}/v1/embeddings", json=body)
                usage = answer.json().get("usage", {}) if answer.status_code == 200 else {}
                hits.append((time.monotonic(), usage.get("cached_inputs") == 1))
            except (httpx.HTTPError, ValueError):
                hits.append((time.monotonic(), False))
            await asyncio.sleep(0.5)


def cache_recovery_s(hits: list[tuple[float, bool]], down: float) -> float | None:
    """Seconds from Redis going down to the first cache hit after it."""
    return next((t - down for t, hit in hits if t > down and hit), None)


def kill_recovery_s(run: KillRun, within_s: float = 60) -> float | None:
    """Seconds from the kill to the first of RECOVERED_STREAK 200s in a row, looking at
    the answers of the next `within_s` only (later refusals are load, not the kill)."""
    after = [a for a in run.after_kill() if a.done <= run.killed_at + within_s]
    for i in range(len(after) - RECOVERED_STREAK + 1):
        if all(a.status == 200 for a in after[i : i + RECOVERED_STREAK]):
            return max(after[i].done - run.killed_at, 0.0)
    return None
