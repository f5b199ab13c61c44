"""Which malloc the replicas get (config/allocator.py), and the heap trim on each."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from deployments.app import build_app
from deployments.config.allocator import (
    FENCED_ARENA_MAX,
    FENCED_ARENAS,
    PRELOAD,
    jemalloc_path,
    with_allocator,
)

ROOT = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_PRELOAD")


@linux_only
def test_a_process_started_with_rays_jemalloc_preloaded_runs_on_it() -> None:
    script = (
        "import ctypes, pathlib\n"
        "maps = pathlib.Path('/proc/self/maps').read_text()\n"
        "print('libjemalloc' in maps, hasattr(ctypes.CDLL(None), 'mallctl'))\n"
    )
    out = _run_preloaded(script)
    assert out == "True True", out


@linux_only
def test_jemalloc_is_preloaded_beside_the_env_vars_already_set() -> None:
    options = {"num_cpus": 1, "runtime_env": {"env_vars": {"MALLOC_ARENA_MAX": "2"}}}
    result = with_allocator(options, "jemalloc")
    assert result["runtime_env"]["env_vars"] == {
        "MALLOC_ARENA_MAX": "2",
        PRELOAD: str(jemalloc_path()),
    }
    assert result["num_cpus"] == 1
    assert PRELOAD not in options["runtime_env"]["env_vars"]  # the caller's dict untouched


def test_the_system_allocator_leaves_the_options_alone() -> None:
    options = {"num_cpus": 1}
    assert with_allocator(options, "system") == {"num_cpus": 1}


def test_a_preload_of_the_users_own_is_kept() -> None:
    options = {"runtime_env": {"env_vars": {PRELOAD: "/opt/libtcmalloc.so"}}}
    assert with_allocator(options, "jemalloc") == options


def test_a_replica_fenced_by_an_address_space_limit_keeps_glibc_with_its_arenas_capped() -> None:
    fenced = with_allocator({"num_cpus": 0}, "jemalloc", address_space_fenced=True)
    assert fenced == {"num_cpus": 0, "runtime_env": {"env_vars": {FENCED_ARENAS: "1"}}}
    own = {"runtime_env": {"env_vars": {FENCED_ARENAS: "4"}}}
    assert with_allocator(own, "system", address_space_fenced=True) == own


@linux_only
def test_capped_arenas_keep_a_fences_room_for_the_passes_when_threads_start_after_it() -> None:
    """Three threads that start after a 100 MiB fence and allocate side by side: on
    glibc's defaults one of them got an arena of its own (64 MiB of the room); capped,
    they take only their stacks."""
    script = (
        "import ctypes, threading, time\n"
        "from deployments.replicas.memory import _libc, address_space, apply_memory_limit\n"
        "libc = _libc()\n"
        "libc.malloc.restype = ctypes.c_void_p\n"
        "libc.free.argtypes = [ctypes.c_void_p]\n"
        "def churn(stop):\n"
        "    while not stop.is_set():\n"
        "        libc.free(libc.malloc(200))\n"
        "stop = threading.Event()\n"
        "old = [threading.Thread(target=churn, args=(stop,)) for _ in range(4)]\n"
        "[t.start() for t in old]\n"
        "time.sleep(0.3)\n"
        "apply_memory_limit(100)\n"
        "new = [threading.Thread(target=churn, args=(stop,)) for _ in range(3)]\n"
        "[t.start() for t in new]\n"
        "time.sleep(0.5)\n"
        "room = address_space()['room_bytes']\n"
        "stop.set()\n"
        "[t.join() for t in old + new]\n"
        "print(room // 2**20)\n"
    )
    room_mib = int(_run_fresh(script, {FENCED_ARENAS: str(FENCED_ARENA_MAX)}))
    assert room_mib >= 100 - 3 * 8 - 8, f"{room_mib} MiB of the fence's 100 left"


def _preloads(args: dict) -> dict[str, str | None]:
    """Each deployment of the built app: the LD_PRELOAD its replicas start with."""
    app = build_app(args)
    found = {}
    ingress = app._bound_deployment  # the app's root
    nodes = [
        ingress,
        *[
            bound._bound_deployment
            for group in ("embedders", "rerankers", "generators")
            for bound in app._bound_deployment.init_kwargs[group].values()
        ],
    ]
    for deployment in nodes:
        env = (deployment.ray_actor_options.get("runtime_env") or {}).get("env_vars") or {}
        found[deployment.name] = env.get(PRELOAD)
    return found


@linux_only
def test_every_replica_of_the_default_app_runs_on_jemalloc() -> None:
    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    preloads = _preloads(args)
    assert len(preloads) >= 4
    assert set(preloads.values()) == {str(jemalloc_path())}, preloads
    assert set(_preloads({**args, "allocator": "system"}).values()) == {None}


@linux_only
def test_trim_heap_purges_jemalloc_where_it_is_preloaded() -> None:
    script = (
        "from deployments.core.process_status import status_kib\n"
        "from deployments.replicas.memory import trim_heap\n"
        "blocks = [bytes(1000) for _ in range(200_000)]\n"
        "del blocks\n"
        "before = status_kib('VmRSS')\n"
        "trim_heap()\n"
        "print(before - status_kib('VmRSS'))\n"
    )
    returned_kib = int(_run_preloaded(script))
    # 200 MB freed: jemalloc keeps freed pages for seconds, the purge hands them back now.
    assert returned_kib > 20 * 1024, f"the trim returned {returned_kib} KiB"


def _run_preloaded(script: str) -> str:
    """`script`'s output, run by a Python started with Ray's jemalloc preloaded (a preload
    takes effect only at a process's start)."""
    path = jemalloc_path()
    assert path is not None
    return _run_fresh(script, {PRELOAD: str(path)})


def _run_fresh(script: str, env: dict[str, str]) -> str:
    """`script`'s output, run by a Python started with only `env` (and a PATH) set: what
    takes effect only at a process's start, or binds the whole process."""
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()
