"""The launcher's start-up watch (deployments/launch/start_watch.py): one status a poll for
every check, handed to `on_running` once the applications run, stopped by the first check
that says so."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from deployments.launch.start_watch import StartWatch, Verdict


def _status(app_status: str) -> SimpleNamespace:
    return SimpleNamespace(applications={"tributary": SimpleNamespace(status=app_status)})


class Check:
    """Says each status it is shown; stops at the `stop_at`-th look."""

    exit_status = 9
    stopped_because = "a test said so"

    def __init__(self, name: str, stop_at: int | None = None) -> None:
        self.name = name
        self.stop_at = stop_at
        self.looks: list[Any] = []

    def look(self, status: Any, now: float) -> Verdict:
        self.looks.append(status)
        if len(self.looks) == self.stop_at:
            return Verdict([f"{self.name} last"], f"{self.name} stops")
        return Verdict([f"{self.name} {len(self.looks)}"])


def _watch(statuses: list[Any], checks: list[Check], said: list[str]) -> StartWatch:
    answers = iter(statuses)

    def status() -> Any:
        answer = next(answers, statuses[-1])
        if isinstance(answer, Exception):
            raise answer
        return answer

    return StartWatch(
        status,
        checks,
        said.append,
        give_up=lambda: said.append("SIGINT"),
        on_running=lambda: said.append("running"),
        poll_s=0,
    )


def test_every_check_sees_each_status_once_until_the_apps_run() -> None:
    said: list[str] = []
    first, second = Check("placement"), Check("failed start")
    deploying = _status("DEPLOYING")
    watch = _watch([deploying, deploying, _status("RUNNING")], [first, second], said)
    watch.run()
    assert first.looks == second.looks == [deploying, deploying]
    assert said == ["placement 1", "failed start 1", "placement 2", "failed start 2", "running"]
    assert watch.stopped_by is None


def test_the_first_check_that_stops_names_itself_and_the_rest_are_not_asked() -> None:
    said: list[str] = []
    first, second = Check("placement", stop_at=2), Check("failed start")
    watch = _watch([_status("DEPLOYING")], [first, second], said)
    watch.run()
    assert said == ["placement 1", "failed start 1", "placement last", "placement stops", "SIGINT"]
    assert watch.stopped_by is first and len(second.looks) == 1


def test_a_status_that_cannot_be_read_is_asked_again_and_shown_to_nobody() -> None:
    said: list[str] = []
    check = Check("placement")
    statuses = [ConnectionError("controller starting"), _status("DEPLOYING"), _status("RUNNING")]
    _watch(statuses, [check], said).run()
    assert said == ["placement 1", "running"]


def test_an_empty_status_is_not_running() -> None:
    said: list[str] = []
    check = Check("placement")
    _watch([SimpleNamespace(applications={}), _status("RUNNING")], [check], said).run()
    assert len(check.looks) == 1
