"""Ray's helper processes yield the cores to the replicas.

Ray starts its workers, and so every Serve replica, at niceness 15, and leaves its own
processes at the launcher's (0). Most of those are small and steady (the GCS, the raylet),
but the dashboard's agent, which gathers every worker's metrics and process figures, works
in bursts: every 10 s, ~300 ms of a core at once on a 2-core machine. At niceness 0 against
15 such a burst has the core to itself, and whatever request is on its way through the
replicas then waits for it: in one 25 s window under `bench.device_share`'s flood, three of
the five slowest realtime requests fell inside one burst (docs/benchmarks.md, "Ray's helpers
at the replicas' expense"). Monitoring, log shipping and the launcher's own `serve run` loop
can wait for a few milliseconds; a request should not. So once Ray is up, the launcher
lowers those processes (the dashboard's head and its modules, the dashboard's and the
runtime environments' agents, the log monitor, the autoscaler's monitor), and itself, below
the replicas (niceness 19): they still run, on what the replicas leave, and none of their
work is lost. The GCS and the raylet keep their priority: they schedule and watch the
replicas.

Only raises a niceness (which any user may do to their own processes), per thread, as
Linux keeps it (threads started later inherit it from the thread that starts them). A
no-op where there is no /proc.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from deployments.core.process_tree import PROC, below, children_by_parent

# Below Ray's workers (15): what these processes do waits for the replicas.
HELPER_NICENESS = 19

# What names each helper in its command line (Ray 2.60): the titles the agents give
# themselves, and the scripts of the dashboard's head, the agents, the log monitor and the
# autoscaler's monitor (an argument that ends with one). What a helper starts is a helper
# too: the dashboard's head runs each of its modules in a process of its own.
HELPER_TITLES = ("ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray-dashboard-")
HELPER_SCRIPTS = (
    "/dashboard/dashboard.py",
    "/dashboard/agent.py",
    "/runtime_env/agent/main.py",
    "/_private/log_monitor.py",
    "/autoscaler/_private/monitor.py",
)


def helper_pids(root: int, proc: Path = PROC) -> list[int]:
    """The processes below `root` whose command line names a Ray helper, and theirs."""
    tree = children_by_parent(proc)
    helpers = {pid for pid in below(root, tree) if _is_helper(pid, proc)}
    for pid in list(helpers):
        helpers |= below(pid, tree)
    return sorted(helpers)


def lower_priority(pid: int, niceness: int = HELPER_NICENESS, proc: Path = PROC) -> int:
    """Sets every thread of `pid` that runs above `niceness` to it; returns how many it
    changed. A thread or process that is gone meanwhile is passed over."""
    changed = 0
    for tid in _threads(pid, proc):
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < niceness:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
                changed += 1
        except (ProcessLookupError, PermissionError):
            continue
    return changed


def yield_helpers(
    root: int | None = None, niceness: int = HELPER_NICENESS, proc: Path = PROC
) -> list[int]:
    """Lowers Ray's helpers below `root` (default: this process) and `root` itself to
    `niceness`; returns the pids of the helpers found. Call once `root` has started Ray:
    what it starts from then on (the GCS, the raylet and through it every replica, had
    they not started yet) would inherit the niceness."""
    root = os.getpid() if root is None else root
    if not proc.is_dir():
        return []
    found = helper_pids(root, proc)
    for pid in found:
        lower_priority(pid, niceness, proc)
    lower_priority(root, niceness, proc)
    return found


def names_a_helper(command: str) -> bool:
    """Whether a command line (its arguments NUL-separated, as /proc has it) is a helper's."""
    return any(
        argument.startswith(HELPER_TITLES) or argument.endswith(HELPER_SCRIPTS)
        for argument in command.split("\0")
    )


def _is_helper(pid: int, proc: Path) -> bool:
    try:
        command = (proc / str(pid) / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return names_a_helper(command)


def _threads(pid: int, proc: Path) -> Iterable[int]:
    try:
        return [int(task.name) for task in (proc / str(pid) / "task").iterdir()]
    except OSError:
        return []
