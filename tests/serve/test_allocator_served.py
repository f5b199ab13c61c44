"""The replicas of the served app run on jemalloc (config/allocator.py), all but the one
fenced by an address-space limit, and serve on it."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from bench.server import Server
from tests.reliability.procs import find
from tests.serve.conftest import AUTH, FENCED_MODEL, MODEL

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, LD_PRELOAD")


def _on_jemalloc(pid: int) -> bool:
    return "libjemalloc" in Path(f"/proc/{pid}/maps").read_text()


def _environment(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().partition("=")[::2] for entry in raw if b"=" in entry)


def test_every_replica_but_the_fenced_one_runs_on_jemalloc(server: Server) -> None:
    for model in (MODEL, FENCED_MODEL):  # both up and answering first
        response = httpx.post(
            f"{server.url}/v1/embeddings",
            json={"model": model, "input": ["a replica on its allocator"]},
            headers=AUTH,
            timeout=60,
        )
        assert response.status_code == 200, response.text
    replicas = {pid: _on_jemalloc(pid) for pid in find(server, "ServeReplica:tributary:")}
    fenced = set(find(server, f"ServeReplica:tributary:embed-{FENCED_MODEL}"))
    assert fenced and len(replicas) > len(fenced) + 3, replicas
    assert {pid for pid, on in replicas.items() if not on} == fenced, replicas
    # The fenced one keeps glibc with one arena: no arena's 64 MiB reservation after the fence.
    assert all(_environment(pid).get("MALLOC_ARENA_MAX") == "1" for pid in fenced)
