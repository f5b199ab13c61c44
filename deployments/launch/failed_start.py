"""Saying so when a replica fails to start, and stopping once Serve has given up on it.

When a replica's constructor raises (a model that will not load, a library of the wrong
version), Serve retries it a few times (3 per replica it wants, at most the deployment's
`max_constructor_retry_count`), then marks the application DEPLOY_FAILED. `serve run` prints
none of that and waits on: on a GPU machine whose transformers lacked an argument the LLM
engine passes, the launcher sat silent until the benchmark around it timed out. The launcher's
start-up watch (start_watch.py) therefore shows this check each status while the
applications start, and it
- says each replica failure as it comes: which deployment, the exception's last line, and
  how many more times Serve will try;
- once an application is DEPLOY_FAILED, says Serve's whole message for each failed
  deployment (the replica's traceback) and stops, with its own exit status.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deployments.launch.start_watch import Verdict

# What Serve writes into a deployment's status message after a failed replica start
# (ray/serve/_private/deployment_state.py, record_replica_startup_failure).
REPLICA_FAILED = "A replica failed to start"
DEPLOY_FAILED = "DEPLOY_FAILED"
EXIT_FAILED_START = 4
# Lines of a traceback kept in the final message: the frames nearest the error.
TRACEBACK_LINES = 12


def replica_failures(status: Any) -> dict[str, str]:
    """From `serve.status()`: each deployment whose last replica start failed, with Serve's
    message."""
    return {
        f"{app}/{name}": deployment.message
        for app, overview in status.applications.items()
        for name, deployment in overview.deployments.items()
        if (deployment.message or "").startswith(REPLICA_FAILED)
    }


def failed_deployments(status: Any) -> dict[str, str]:
    """Each deployment of a DEPLOY_FAILED application that failed, with Serve's message; the
    application's own message where no deployment says more (its builder raised)."""
    failed: dict[str, str] = {}
    for app, overview in status.applications.items():
        if overview.status != DEPLOY_FAILED:
            continue
        own = {
            f"{app}/{name}": deployment.message
            for name, deployment in overview.deployments.items()
            if deployment.status == DEPLOY_FAILED and deployment.message
        }
        failed.update(own or {app: overview.message or "no message"})
    return failed


def last_line(message: str) -> str:
    """The exception's own line: the last non-empty line of Serve's message."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1] if lines else message


def retries_left(message: str) -> str:
    """Serve's "Retrying N more time(s)" as "N more time(s)", or "" where it says none."""
    head = message.split("Error:", 1)[0]
    marker = "Retrying "
    if marker not in head:
        return ""
    return head.split(marker, 1)[1].strip().rstrip(".")


def failure_notice(deployment: str, message: str) -> str:
    left = retries_left(message)
    then = f"; Serve tries {left}" if left else ""
    return f"{deployment}: a replica failed to start: {last_line(message)}{then}"


def tail(message: str, lines: int = TRACEBACK_LINES) -> str:
    kept = message.rstrip().splitlines()
    cut = ["  ..."] if len(kept) > lines + 1 else []
    return "\n".join(cut + [f"  {line}" for line in kept[-lines - 1 :]])


def give_up_message(failed: Mapping[str, str]) -> str:
    parts = ["Serve gave up starting the app. Serve says:"]
    for name, message in failed.items():
        parts += [f"{name}:", tail(message)]
    return "\n".join(parts)


class FailedStartCheck:
    """Says each failed start once; stops once Serve has given up on an application."""

    exit_status = EXIT_FAILED_START
    stopped_because = "a deployment failed to start (above: Serve's error)"

    def __init__(self) -> None:
        self._said: set[tuple[str, str]] = set()

    def look(self, status: Any, now: float) -> Verdict:
        failed = failed_deployments(status)
        if failed:
            return Verdict([], give_up_message(failed))
        notices = []
        for deployment, message in replica_failures(status).items():
            if (deployment, message) not in self._said:
                self._said.add((deployment, message))
                notices.append(failure_notice(deployment, message))
        return Verdict(notices)
