"""Watching Serve while the applications start, and stopping the launcher when a check
says the start cannot succeed.

One daemon thread asks `serve.status()` once a poll and shows the answer to each check: a
replica no node has room for (placement.py) and a replica whose constructor fails
(failed_start.py). A check says what it sees as it comes and may stop the launcher with a
message. Once every application is RUNNING the watch hands its thread to `on_running` (the
ready line: launch/output.py) and ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

POLL_S = 1.0
RUNNING = "RUNNING"


class Verdict(NamedTuple):
    """What a check made of one status: lines to say now, and the message to stop with
    (None: go on)."""

    notices: list[str]
    stop: str | None = None


class StartCheck(Protocol):
    # The launcher's exit status, and the end of its last line, after this check stopped it.
    exit_status: int
    stopped_because: str

    def look(self, status: Any, now: float) -> Verdict: ...


def all_running(status: Any) -> bool:
    applications = status.applications
    return bool(applications) and all(a.status == RUNNING for a in applications.values())


@dataclass
class StartWatch:
    status: Callable[[], Any]  # serve.status
    checks: Sequence[StartCheck]
    say: Callable[[str], None]
    give_up: Callable[[], None]  # stops the launcher
    # Called once, on the watch's thread, when every application runs.
    on_running: Callable[[], None] = lambda: None
    poll_s: float = POLL_S
    # The check that stopped the launcher; set before `give_up` is called.
    stopped_by: StartCheck | None = None

    def run(self) -> None:
        while True:
            try:
                status = self.status()
            except Exception:  # Serve starting or stopping: ask again
                status = None
            if status is not None:
                if all_running(status):
                    self.on_running()
                    return
                if self._stopped(status):
                    return
            time.sleep(self.poll_s)

    def _stopped(self, status: Any) -> bool:
        now = time.monotonic()
        for check in self.checks:
            notices, stop = check.look(status, now)
            for notice in notices:
                self.say(notice)
            if stop is not None:
                self.say(stop)
                self.stopped_by = check
                self.give_up()
                return True
        return False

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="tributary-start-watch", daemon=True)
        thread.start()
        return thread
