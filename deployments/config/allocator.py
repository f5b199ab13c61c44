"""Which malloc the replicas run on: jemalloc, the copy Ray's wheel carries, by default.

Under the soak's hour of mixed load, glibc's malloc let the embedder's RSS climb 10-25 MiB
an hour and swing by 40 MiB, in its per-thread arenas, while jemalloc's heap profile of the
same replica found the memory in use grew little (4.7 MB in 20 minutes, most of it one
dict's table; docs/reliability.md, "The replicas on jemalloc"). On jemalloc the same load's
replicas grew less and without the swings, so it is preloaded into each replica at its start.

Ray ships `ray/core/libjemalloc.so` (exporting malloc and free) in its Linux wheels, so the
default needs nothing beyond `pip install ray[serve]`; where it is missing, or on another
system, the replicas keep the system's malloc.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

Allocator = Literal["jemalloc", "system"]

PRELOAD = "LD_PRELOAD"
# glibc gives a thread that meets a busy arena a new one, reserving 64 MiB of address space
# at once (and 64 more each time such an arena outgrows its heap). In a fenced replica, one
# thread started after the fence (Ray's, the metrics flusher) could so take most of a
# 100 MiB headroom, and every input, even alone, would fail its pass. With one arena, set
# from the process's start (glibc fixes its arena limit early), the heap grows only by what
# is allocated. The fenced replica runs one pass at a time, so its threads seldom meet at
# malloc's lock. The served tests set 2 by hand before this did.
FENCED_ARENAS = "MALLOC_ARENA_MAX"
FENCED_ARENA_MAX = 1


def jemalloc_path() -> Path | None:
    """Ray's own jemalloc, where this platform's wheel carries it."""
    if not sys.platform.startswith("linux"):
        return None
    import ray

    path = Path(ray.__file__).parent / "core" / "libjemalloc.so"
    return path if path.is_file() else None


def with_allocator(
    actor_options: dict[str, Any], allocator: Allocator, address_space_fenced: bool = False
) -> dict[str, Any]:
    """`actor_options` (Serve's `ray_actor_options`) with jemalloc preloaded through the
    runtime_env's env_vars. Left as they are: `system`; a runtime_env that names its own
    LD_PRELOAD. A replica fenced by an address-space limit (`memory_limit_mib`) keeps
    glibc, whose way of mapping its headroom is measured against (jemalloc keeps address
    space it has used, which the limit would count as spent), with its arenas capped."""
    if address_space_fenced:
        return _with_env(actor_options, FENCED_ARENAS, str(FENCED_ARENA_MAX))
    path = jemalloc_path() if allocator == "jemalloc" else None
    if path is None:
        return actor_options
    return _with_env(actor_options, PRELOAD, str(path))


def _with_env(actor_options: dict[str, Any], name: str, value: str) -> dict[str, Any]:
    """`actor_options` with `name=value` in the runtime_env's env_vars, unless the user's
    options already set it (then they are returned as they are)."""
    runtime_env = dict(actor_options.get("runtime_env") or {})
    env_vars = dict(runtime_env.get("env_vars") or {})
    if name in env_vars:
        return actor_options
    env_vars[name] = value
    runtime_env["env_vars"] = env_vars
    return {**actor_options, "runtime_env": runtime_env}
