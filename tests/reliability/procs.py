"""The processes of a running server, found from the launch process down (/proc), and
their resident memory; the one ingress replica kept for realtime, which only the server knows,
is asked of its /v1/stats."""

from __future__ import annotations

from pathlib import Path

import httpx

from bench.server import Server, descendants
from deployments.core.process_status import status_kib


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def rss_mib(pid: int) -> float | None:
    kib = status_kib("VmRSS", pid)
    return None if kib is None else kib / 1024


def find(server: Server, needle: str) -> list[int]:
    """This server's processes whose command line contains `needle`."""
    return sorted(pid for pid in descendants(server.process.pid) if needle in cmdline(pid))


def owned(server: Server, pid: int) -> bool:
    """Whether `pid` is one of the processes this server started (so ours to kill)."""
    return pid in descendants(server.process.pid)


def realtime_ingress_pid(server: Server) -> int | None:
    """The ingress replica HAProxy keeps for realtime, by the pid it reports in /v1/stats
    (the Batch API's dispatcher names its own process); None when one replica answers
    both kinds of request, or the stats name no pid."""
    pids = []
    for headers in ({"X-Priority": "realtime"}, {}):
        try:
            stats = httpx.get(f"{server.url}/v1/stats", headers=headers, timeout=10).json()
        except (httpx.HTTPError, ValueError):
            return None
        batches = stats.get("batches") if isinstance(stats, dict) else None
        pids.append(batches.get("pid") if isinstance(batches, dict) else None)
    kept, other = pids
    return kept if isinstance(kept, int) and kept != other else None
