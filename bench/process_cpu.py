"""Where a machine's cores went between two readings of /proc: every process's CPU time,
summed by the part of the server it is (a replica by its deployment, Serve's controller and
HAProxy manager, HAProxy, Ray's own processes), the load generator apart, and the machine's
busy, idle and stolen time. `test_overload.py` records it for its capacity and 2x phases
(docs/reliability.md).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from deployments.core.process_tree import PROC
from deployments.launch.helper_priority import names_a_helper

TICKS_PER_S = os.sysconf("SC_CLK_TCK")

# A Ray worker names itself after its actor: ray::ServeReplica:<app>:<deployment>.
_REPLICA = "ray::ServeReplica:"
_BY_COMMAND = (
    ("ray::ServeController", "Serve's controller"),
    ("ray::HAProxyManager", "Serve's HAProxy manager"),
    ("ray::ProxyActor", "Serve's proxy actor"),
    ("/raylet", "raylet"),
    ("/gcs_server", "GCS"),
    ("deployments.launch", "the launcher"),
)


@dataclass(frozen=True)
class CpuReading:
    at: float  # time.monotonic()
    ticks: dict[int, int]  # per pid: user + system time, in clock ticks
    roles: dict[int, str]
    machine: dict[str, int]  # busy, idle, steal: all cores, in clock ticks


def role(command: str) -> str:
    """What a process is to the server, from its command line (NUL-separated)."""
    program = command.split("\0", 1)[0]
    if program.startswith(_REPLICA):
        return "replica " + program[len(_REPLICA) :].rsplit(":", 1)[-1]
    if program.endswith("/haproxy"):
        return "HAProxy"
    if names_a_helper(command):
        return "Ray's helpers"  # the ones the launcher lowers below the replicas
    for needle, name in _BY_COMMAND:
        if needle in command:
            return name
    return "rest of the machine"


def cpu_ticks(stat: Path) -> int:
    """A process's (or a thread's) user + system time so far, in clock ticks, from its
    /proc stat file. The name in parentheses may hold spaces; utime and stime are fields 14
    and 15."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def read_cpu(load_generator: int | None = None, proc: Path = PROC) -> CpuReading:
    """Every process's CPU time so far; `load_generator` (a pid) is named apart."""
    ticks: dict[int, int] = {}
    roles: dict[int, str] = {}
    for entry in proc.glob("[0-9]*"):
        try:
            spent = cpu_ticks(entry / "stat")
            command = (entry / "cmdline").read_bytes().decode(errors="replace")
        except (OSError, IndexError):
            continue
        pid = int(entry.name)
        ticks[pid] = spent
        roles[pid] = "load generator" if pid == load_generator else role(command)
    return CpuReading(time.monotonic(), ticks, roles, _machine(proc))


def _machine(proc: Path) -> dict[str, int]:
    user, nice, system, idle, iowait, irq, softirq, steal = map(
        int, (proc / "stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return {
        "busy": user + nice + system + irq + softirq,
        "idle": idle + iowait,
        "steal": steal,
    }


def cores_between(before: CpuReading, after: CpuReading) -> dict[str, float]:
    """Cores each role used on average between the readings (a process that started
    in between counts from its start, one that ended is missing), then the machine's
    `busy`, `idle` and `steal` cores, largest roles first."""
    seconds = max(after.at - before.at, 1e-9)
    used: dict[str, float] = {}
    for pid, ticks in after.ticks.items():
        spent = ticks - before.ticks.get(pid, 0)
        used[after.roles[pid]] = used.get(after.roles[pid], 0.0) + spent / TICKS_PER_S / seconds
    ranked = dict(sorted(((k, round(v, 3)) for k, v in used.items()), key=lambda kv: -kv[1]))
    for key, ticks in after.machine.items():
        ranked[f"machine {key}"] = round((ticks - before.machine[key]) / TICKS_PER_S / seconds, 3)
    return ranked
