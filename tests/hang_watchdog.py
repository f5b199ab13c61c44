"""A hung test ends the run with every thread's stack instead of holding CI to its limit.

pytest-timeout (600 s, by SIGALRM) fails a test whose Python code hangs, but only once per
test and only where Python code runs: a hang in native code that never returns to Python,
or one that begins after it fired (a teardown waiting on what the timed-out test left
running), would hold the whole run until CI kills it, with no trace of where it stuck.
faulthandler's watchdog is a C thread that needs neither: once a test (setup, call and
teardown together) passes HARD_LIMIT_S, it prints each thread's stack and ends the process.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import time
from collections.abc import Generator

import pytest

# Past pytest-timeout's 600 s, so that one gets the first word; the variable is for the
# watchdog's own test.
HARD_LIMIT_S = float(os.environ.get("TRIBUTARY_TEST_HARD_LIMIT_S", "720"))

_deadline = pytest.StashKey[float]()
_stderr_fd = pytest.StashKey[int]()


def pytest_configure(config: pytest.Config) -> None:
    # A copy of the real stderr, taken while output capture is off: during a test, fd 2
    # is pytest's capture file and a dump there would be seen by nobody.
    assert sys.__stderr__ is not None
    config.stash[_stderr_fd] = os.dup(sys.__stderr__.fileno())


def pytest_unconfigure(config: pytest.Config) -> None:
    if _stderr_fd in config.stash:
        faulthandler.cancel_dump_traceback_later()
        os.close(config.stash[_stderr_fd])
        del config.stash[_stderr_fd]


def _arm(item: pytest.Item) -> None:
    left = item.stash[_deadline] - time.monotonic()
    fd = item.config.stash[_stderr_fd]
    faulthandler.dump_traceback_later(max(left, 1.0), exit=True, file=fd)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    item.stash[_deadline] = time.monotonic() + HARD_LIMIT_S
    _arm(item)
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(trylast=True)
def pytest_exception_interact(node: pytest.Item | pytest.Collector) -> None:
    # pytest's own faulthandler plugin stops the watchdog at every failure, and the
    # teardown after a failure is just where such a hang begins: set it again.
    if isinstance(node, pytest.Item) and _deadline in node.stash:
        _arm(node)
