"""Ray's helpers lowered below the replicas (launch/helper_priority.py), on real processes:
children of this test named as Ray names its helpers, each with a second thread."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deployments.core.process_tree import descendants
from deployments.launch.helper_priority import helper_pids, lower_priority, yield_helpers

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc (Linux)")

# Sleeps on two threads; what follows `-c` is its argv, and so its command line.
SLEEPER = (
    "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); "
    "time.sleep(60)"
)


def sleeper(name: str) -> list[str]:
    return [sys.executable, "-c", SLEEPER, name]


def threads(pid: int) -> list[int]:
    return [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]


def niceness_of_threads(pid: int) -> set[int]:
    return {os.getpriority(os.PRIO_PROCESS, tid) for tid in threads(pid)}


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, "the sleepers did not start"
        time.sleep(0.02)


@pytest.fixture
def children() -> Iterator[dict[str, subprocess.Popen]]:
    """A process named as the dashboard's agent, one as a model replica, and a shell whose
    child is named as the log monitor."""
    log_monitor = " ".join(f"'{part}'" for part in sleeper("/ray/_private/log_monitor.py"))
    started = {
        "agent": subprocess.Popen(sleeper("ray::DashboardAgent")),
        "replica": subprocess.Popen(sleeper("ray::ServeReplica:tributary:embed")),
        "shell": subprocess.Popen(["sh", "-c", f"{log_monitor}; :"]),
    }
    try:
        wait_for(lambda: len(threads(started["agent"].pid)) == 2)
        # Until the shell's child has exec'd, its command line is still the shell's.
        wait_for(lambda: bool(descendants(started["shell"].pid) & set(helper_pids(os.getpid()))))
        yield started
    finally:
        for process in started.values():
            process.kill()
            process.wait()


def test_helpers_below_the_root_are_found_by_their_command_line(children) -> None:
    found = set(helper_pids(os.getpid()))
    assert children["agent"].pid in found
    assert children["replica"].pid not in found and children["shell"].pid not in found
    # The log monitor, the shell's child, is found through its parent.
    (grandchild,) = descendants(children["shell"].pid)
    assert grandchild in found


def test_every_thread_of_a_helper_is_lowered_only_ever_down(children) -> None:
    agent = children["agent"].pid
    assert lower_priority(agent, 19) == 2
    assert niceness_of_threads(agent) == {19}
    assert lower_priority(agent, 19) == 0  # already there
    assert lower_priority(agent, 10) == 0  # never raised back up
    assert niceness_of_threads(agent) == {19}
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    assert niceness_of_threads(children["replica"].pid) == {ours}


def test_what_a_helper_starts_is_a_helper_too() -> None:
    # A dashboard's head whose module runs in a process of its own, as Ray's does.
    module = sleeper("ray-dashboard-like-module")
    script = f"import subprocess, time; subprocess.Popen({module!r}); time.sleep(60)"
    head = subprocess.Popen([sys.executable, "-c", script, "/ray/dashboard/dashboard.py"])
    try:
        wait_for(lambda: len(descendants(head.pid)) == 1)
        (module_pid,) = descendants(head.pid)  # a helper because its parent is one
        assert {head.pid, module_pid} <= set(helper_pids(os.getpid()))
    finally:
        for pid in helper_pids(head.pid):
            os.kill(pid, 9)
        head.kill()
        head.wait()


def test_the_root_is_lowered_with_its_helpers() -> None:
    # A root of its own, with a helper below it: lowering this test's process would last.
    agent = sleeper("/ray/dashboard/agent.py")
    script = f"import subprocess, time; subprocess.Popen({agent!r}); time.sleep(60)"
    root = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_for(lambda: len(helper_pids(root.pid)) == 1)  # once the child has exec'd
        (helper,) = yield_helpers(root=root.pid, niceness=17)
        assert niceness_of_threads(helper) == {17}
        assert niceness_of_threads(root.pid) == {17}
    finally:
        for pid in helper_pids(root.pid):
            os.kill(pid, 9)
        root.kill()
        root.wait()
