"""The launcher's check for replicas that fail to start (deployments/launch/failed_start.py),
in the start-up watch, on statuses shaped as `serve.status()` returns them;
tests/serve/test_failed_start_served.py runs it against Serve."""

from __future__ import annotations

from types import SimpleNamespace

from deployments.launch.failed_start import (
    EXIT_FAILED_START,
    FailedStartCheck,
    failed_deployments,
    failure_notice,
    replica_failures,
    tail,
)
from deployments.launch.start_watch import StartWatch

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "deployments/backends/generation/continuous.py", line 185, in _new_manager\n'
    "TypeError: ContinuousBatchingConfig.__init__() got an unexpected keyword argument "
    "'page_size'"
)
# Serve's messages, as deployment_state.py words them.
RETRYING = f"A replica failed to start with exception. Retrying 2 more time(s). Error:\n{TRACEBACK}"
GAVE_UP = (
    "The deployment failed to start 3 times in a row. This may be due to a problem with its "
    f"constructor or initial health check failing. See controller logs for details. "
    f"Error:\n{TRACEBACK}"
)
SLOW = "Deployment 'embed' has 1 replicas that have taken more than 30s to initialize."


def _status(
    app_status: str, app_message: str = "", **deployments: tuple[str, str]
) -> SimpleNamespace:
    overview = SimpleNamespace(
        status=app_status,
        message=app_message,
        deployments={
            name: SimpleNamespace(status=status, message=message)
            for name, (status, message) in deployments.items()
        },
    )
    return SimpleNamespace(applications={"tributary": overview})


def test_only_deployments_whose_replica_failed_are_reported() -> None:
    status = _status(
        "DEPLOYING",
        llm=("UPDATING", RETRYING),
        embed=("UPDATING", SLOW),
        ingress=("HEALTHY", ""),
    )
    assert replica_failures(status) == {"tributary/llm": RETRYING}
    assert failed_deployments(status) == {}
    assert replica_failures(_status("RUNNING", llm=("HEALTHY", ""))) == {}


def test_the_notice_names_the_deployment_the_error_and_the_retries_left() -> None:
    notice = failure_notice("tributary/llm", RETRYING)
    assert notice == (
        "tributary/llm: a replica failed to start: TypeError: ContinuousBatchingConfig."
        "__init__() got an unexpected keyword argument 'page_size'; Serve tries 2 more time(s)"
    )
    assert failure_notice("tributary/llm", "A replica failed to start. Error:\nOSError: x") == (
        "tributary/llm: a replica failed to start: OSError: x"
    )


def test_a_failed_application_is_reported_per_deployment_or_by_its_own_message() -> None:
    failed = _status("DEPLOY_FAILED", llm=("DEPLOY_FAILED", GAVE_UP), embed=("HEALTHY", ""))
    assert failed_deployments(failed) == {"tributary/llm": GAVE_UP}
    builder = _status("DEPLOY_FAILED", "Deploying app 'tributary' failed: ValueError: bad args")
    assert failed_deployments(builder) == {
        "tributary": "Deploying app 'tributary' failed: ValueError: bad args"
    }


def test_a_long_traceback_keeps_its_last_lines() -> None:
    long = "\n".join(f"line {n}" for n in range(40))
    kept = tail(long, lines=3).splitlines()
    assert kept == ["  ...", "  line 36", "  line 37", "  line 38", "  line 39"]
    assert tail("one\ntwo", lines=3).splitlines() == ["  one", "  two"]


def _watch(statuses: list[SimpleNamespace], said: list[str], stops: list[bool]) -> StartWatch:
    answers = iter(statuses)
    return StartWatch(
        status=lambda: next(answers, statuses[-1]),
        checks=[FailedStartCheck()],
        say=said.append,
        give_up=lambda: stops.append(True),
        poll_s=0.001,
    )


def test_each_failure_is_said_once_then_serves_give_up_stops_the_launch() -> None:
    said: list[str] = []
    stops: list[bool] = []
    retrying = _status("DEPLOYING", llm=("UPDATING", RETRYING))
    once_more = _status("DEPLOYING", llm=("UPDATING", RETRYING.replace("2 more", "1 more")))
    gave_up = _status("DEPLOY_FAILED", llm=("DEPLOY_FAILED", GAVE_UP))
    watch = _watch([retrying, retrying, once_more, gave_up], said, stops)
    watch.run()
    assert stops == [True] and watch.stopped_by is not None
    assert watch.stopped_by.exit_status == EXIT_FAILED_START
    assert [line.rsplit("; ", 1)[-1] for line in said[:2]] == [
        "Serve tries 2 more time(s)",
        "Serve tries 1 more time(s)",
    ]
    assert said[2].startswith("Serve gave up starting the app. Serve says:\ntributary/llm:")
    assert "unexpected keyword argument 'page_size'" in said[2]
    assert len(said) == 3


def test_a_slow_start_is_no_failure() -> None:
    said: list[str] = []
    stops: list[bool] = []
    starting = _status("DEPLOYING", embed=("UPDATING", SLOW))
    watch = _watch([starting, _status("RUNNING", embed=("HEALTHY", ""))], said, stops)
    watch.run()
    assert said == [] and stops == [] and watch.stopped_by is None
