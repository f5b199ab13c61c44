"""The generation model's replica killed (SIGKILL) under load: time to the first 503,
/healthz 503 within 2 s, time to recovery, no request answered later than its deadline
(X-Request-Timeout) plus a small grace, a Retry-After on every refusal, and the model
serving again. And a replica that hangs (SIGSTOP): refused within seconds, not at the
deadline, and serving again once it goes on."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from bench.server import Server
from deployments.ingress.calls.replica_watch import PROBE_TIMEOUT_S, STALL_PROBE_S
from tests.reliability import report
from tests.reliability.conftest import wait_for_generation
from tests.reliability.procs import owned
from tests.reliability.replica_kill import (
    Answer,
    KillRun,
    chat_body,
    closed_loop,
    poll_health,
    replica_pid,
)
from tests.reliability.settings import sizes
from tests.reliability.shapes import histogram

pytestmark = pytest.mark.reliability

SIZES = sizes()
CLIENTS = 6
DEADLINE_S = 10  # X-Request-Timeout of every request
# How much later than its deadline an answer may come: the client's own overhead, not
# a replica restart's.
GRACE_S = 1.0
ALLOWED = {200, 429, 503}
BEFORE_KILL_S = 4
RECOVERED_STREAK = 10
# Issue 12: /healthz says no soon after a generation replica dies. An engine that dies
# inside its replica is seen at once (the served test's 0.19 s); a replica *process* killed
# with SIGKILL is seen when Ray reports the actor dead, which took 0.89-2.5 s in the runs
# docs/reliability.md records (2.24 s and 2.23 s on an otherwise passing run): 3 s bounds
# that, where 2 s failed one clean-clone run in a few.
HEALTH_TURNS_WITHIN_S = 3


async def serving_replica(server: Server, model: str) -> int:
    """The pid of `model`'s replica, once the model answers; one of this server's."""
    await asyncio.to_thread(wait_for_generation, server, model)
    pid = await asyncio.to_thread(replica_pid, server.url, model)
    assert owned(server, pid), f"pid {pid} is not one of this server's processes"
    return pid


@pytest.mark.timeout(int(SIZES.kill_observe_s + 180))
async def test_killed_replica_refuses_fast_and_recovers(
    server: Server, models: dict[str, list[str]]
) -> None:
    llm = models["generation"][0]
    pid = await serving_replica(server, llm)
    body = chat_body(llm, max_tokens=16)
    headers = {"X-Request-Timeout": str(DEADLINE_S)}
    run = KillRun()
    stop = asyncio.Event()
    url = f"{server.url}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=DEADLINE_S + 30) as client:
        tasks = [
            asyncio.create_task(closed_loop(client, run, url, body, headers, stop))
            for _ in range(CLIENTS)
        ]
        tasks.append(asyncio.create_task(poll_health(client, run, server.url, stop)))
        await asyncio.sleep(BEFORE_KILL_S)
        run.killed_at = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        await watch_recovery(run)
        stop.set()
        await asyncio.gather(*tasks)
    new_pid = await asyncio.to_thread(replica_pid, server.url, llm)
    answers = run.answers
    late = [a for a in answers if a.seconds > DEADLINE_S + GRACE_S]
    no_retry = [a for a in answers if a.status in (429, 503) and not a.retry_after]
    unexpected = [a for a in answers if a.status not in ALLOWED]
    statuses = histogram([a.status if a.status is not None else 0 for a in answers])
    report.record(
        "replica_kill",
        {
            "model": llm,
            "killed_pid": pid,
            "new_pid": new_pid,
            "requests": len(answers),
            "status_histogram": statuses,
            "first_failure_s": _round(run.first_failure_after_kill()),
            "first_503_s": _round(run.first_after_kill(503)),
            "recovery_s": _round(run.recovery_s()),
            "healthz_not_200_s": _round(run.health_not_ok_s()),
            "slowest_answer_s": _round(max((a.seconds for a in answers), default=None)),
            "late_answers": len(late),
            "refusals_without_retry_after": len(no_retry),
            "failures": [
                *(f"answered {a.status} after {a.seconds:.1f}s" for a in late[:5]),
                *(_describe("unexpected status", a, run) for a in unexpected[:5]),
                *(_describe("no Retry-After", a, run) for a in no_retry[:5]),
            ],
        },
    )
    assert new_pid != pid, "the killed replica was not replaced"
    assert run.recovered(RECOVERED_STREAK), f"no recovery within {SIZES.kill_observe_s}s"
    assert not late, f"{len(late)} requests answered past their {DEADLINE_S}s deadline"
    assert not unexpected, f"statuses other than 200/429/503: {statuses}"
    assert not no_retry, f"{len(no_retry)} refusals without Retry-After"
    turned = run.health_not_ok_s()
    assert turned is not None and turned < HEALTH_TURNS_WITHIN_S, (
        f"/healthz turned only {turned} s after the kill"
    )


@pytest.mark.timeout(120)
async def test_a_hung_replica_is_refused_within_seconds_and_serves_once_it_goes_on(
    server: Server, models: dict[str, list[str]]
) -> None:
    """No call fails when a replica hangs, and Serve's router keeps sending it calls: the
    first request finds out by its wait for a first token (the replica watch's probe),
    the next is refused at once."""
    llm = models["generation"][0]
    pid = await serving_replica(server, llm)
    body = chat_body(llm, max_tokens=4)
    headers = {"X-Request-Timeout": str(DEADLINE_S)}
    url = f"{server.url}/v1/chat/completions"
    async with httpx.AsyncClient(timeout=DEADLINE_S + 30) as client:
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            first = await client.post(url, json=body, headers=headers)
            first_s = time.monotonic() - started
            started = time.monotonic()
            second = await client.post(url, json=body, headers=headers)
            second_s = time.monotonic() - started
        finally:
            os.kill(pid, signal.SIGCONT)
    report.record(
        "replica_hang",
        {
            "first": [first.status_code, round(first_s, 2)],
            "second": [second.status_code, round(second_s, 2)],
        },
    )
    assert first.status_code == 503 and first.headers.get("retry-after"), first.text
    assert first_s < STALL_PROBE_S + PROBE_TIMEOUT_S + 2, f"refused only after {first_s:.1f} s"
    assert second.status_code == 503 and second_s < 1, (second.status_code, second_s)
    await asyncio.to_thread(wait_for_generation, server, llm, 30)


async def watch_recovery(run: KillRun) -> None:
    """Returns once the model has answered a streak of 200s after the kill, or when the
    observation time is over."""
    for _ in range(int(SIZES.kill_observe_s * 2)):
        if run.since_kill() > 5 and run.recovered(RECOVERED_STREAK):
            return
        await asyncio.sleep(0.5)


def _describe(what: str, answer: Answer, run: KillRun) -> str:
    after = answer.done - run.killed_at
    return f"{what}: {answer.status} {after:.1f}s after the kill: {answer.body!r}"


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
