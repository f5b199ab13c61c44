"""The generation model's replicas killed (SIGKILL) under load. The serving replica alone:
its standby (`standby_replicas`, the shipped config) answers within seconds, and the
replacement stands by. Every replica of the model at once: the first 503 at once, /healthz
503 within 3 s, the model serving again once Serve has replaced them. In both, no request
answered later than its deadline (X-Request-Timeout) plus a small grace, and a Retry-After
on every refusal. A replica that hangs (SIGSTOP) is passed over for the standby, and the
call that waited on it is sent there; with every replica hung, requests are refused within
seconds, not at their deadline, and served again once the replicas go on."""

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
from tests.reliability.procs import find, owned
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
# A standby serves from the call after the one that died with the killed replica (0.40 s
# at rest, docs/reliability.md); the bound leaves room for a busy machine.
STANDBY_TAKES_OVER_S = 3
STANDBY_BACK_WITHIN_S = 90  # Serve's replacement up, standing by in its turn
STANDING_BY = {"serving": 1, "standing_by": 1, "passed_over": 0}


async def serving_replica(server: Server, model: str) -> int:
    """The pid of `model`'s replica, once the model answers; one of this server's."""
    await asyncio.to_thread(wait_for_generation, server, model)
    pid = await asyncio.to_thread(replica_pid, server.url, model)
    assert owned(server, pid), f"pid {pid} is not one of this server's processes"
    return pid


def roles_in_stats(server: Server, model: str) -> dict[str, int]:
    stats = httpx.get(f"{server.url}/v1/stats", timeout=10).json()
    return stats["models"][model].get("replicas") or {}


async def until_one_stands_by(server: Server, model: str, within_s: float) -> None:
    """Waits until `model` has one replica serving and one standing by (the shipped
    config's): /healthz is 200 as soon as one replica runs, the standby may still start."""
    deadline = time.monotonic() + within_s
    while (roles := await asyncio.to_thread(roles_in_stats, server, model)) != STANDING_BY:
        assert time.monotonic() < deadline, f"{model}'s replicas after {within_s} s: {roles}"
        await asyncio.sleep(0.5)


def model_replica_pids(server: Server, model: str) -> list[int]:
    """Every replica process of `model`'s deployment, serving and standing by."""
    return find(server, f"ServeReplica:tributary:generate-{model}")


async def kill_under_load(server: Server, model: str, pids: list[int]) -> KillRun:
    """Six clients in a closed loop of short chats and a /healthz poll; SIGKILL of `pids`
    after BEFORE_KILL_S; returns once the model has recovered or the watch is over."""
    body = chat_body(model, max_tokens=16)
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
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        await watch_recovery(run)
        stop.set()
        await asyncio.gather(*tasks)
    return run


def record_kill(name: str, model: str, pids: list[int], new_pid: int, run: KillRun) -> None:
    answers = run.answers
    report.record(
        name,
        {
            "model": model,
            "killed_pids": pids,
            "new_pid": new_pid,
            "requests": len(answers),
            "status_histogram": histogram([a.status or 0 for a in answers]),
            "first_failure_s": _round(run.first_failure_after_kill()),
            "first_503_s": _round(run.first_after_kill(503)),
            "recovery_s": _round(run.recovery_s()),
            "healthz_not_200_s": _round(run.health_not_ok_s()),
            "slowest_answer_s": _round(max((a.seconds for a in answers), default=None)),
            "failures": [
                *(f"answered {a.status} after {a.seconds:.1f}s" for a in late(run)[:5]),
                *(_describe("unexpected status", a, run) for a in unexpected(run)[:5]),
                *(_describe("no Retry-After", a, run) for a in without_retry_after(run)[:5]),
            ],
        },
    )


def late(run: KillRun) -> list[Answer]:
    return [a for a in run.answers if a.seconds > DEADLINE_S + GRACE_S]


def unexpected(run: KillRun) -> list[Answer]:
    return [a for a in run.answers if a.status not in ALLOWED]


def without_retry_after(run: KillRun) -> list[Answer]:
    return [a for a in run.answers if a.status in (429, 503) and not a.retry_after]


def assert_answered_as_promised(run: KillRun) -> None:
    statuses = histogram([a.status or 0 for a in run.answers])
    assert run.recovered(RECOVERED_STREAK), f"no recovery within {SIZES.kill_observe_s}s"
    assert not late(run), f"{len(late(run))} requests answered past their {DEADLINE_S}s deadline"
    assert not unexpected(run), f"statuses other than 200/429/503: {statuses}"
    assert not without_retry_after(run), (
        f"{len(without_retry_after(run))} refusals lack Retry-After"
    )


@pytest.mark.timeout(int(SIZES.kill_observe_s + STANDBY_BACK_WITHIN_S + 120))
async def test_a_killed_serving_replica_hands_its_calls_to_the_standby(
    server: Server, models: dict[str, list[str]]
) -> None:
    llm = models["generation"][0]
    await until_one_stands_by(server, llm, STANDBY_BACK_WITHIN_S)
    pid = await serving_replica(server, llm)
    run = await kill_under_load(server, llm, [pid])
    new_pid = await asyncio.to_thread(replica_pid, server.url, llm)
    record_kill("replica_kill_standby", llm, [pid], new_pid, run)
    assert new_pid != pid, "the killed replica still serves"
    assert_answered_as_promised(run)
    recovery = run.recovery_s()
    assert recovery is not None and recovery < STANDBY_TAKES_OVER_S, (
        f"the standby answered for good only {recovery} s after the kill"
    )
    # The model serves throughout, so /healthz says so, also while Serve starts the
    # replacement (a load balancer would otherwise drop a node that answers).
    unhealthy = [
        (round(t - run.killed_at, 2), status)
        for t, status in run.health
        if t - run.killed_at > STANDBY_TAKES_OVER_S and status != 200
    ]
    deadline = time.monotonic() + STANDBY_BACK_WITHIN_S
    while await asyncio.to_thread(roles_in_stats, server, llm) != STANDING_BY:
        assert time.monotonic() < deadline, "Serve's replacement never came to stand by"
        health = await asyncio.to_thread(httpx.get, f"{server.url}/healthz", timeout=5)
        if health.status_code != 200:
            unhealthy.append((round(time.monotonic() - run.killed_at, 2), health.status_code))
        await asyncio.sleep(0.5)
    assert not unhealthy, f"/healthz not 200 while the standby served: {unhealthy[:5]}"


@pytest.mark.timeout(int(SIZES.kill_observe_s + 180))
async def test_killed_replicas_refuse_fast_and_recover(
    server: Server, models: dict[str, list[str]]
) -> None:
    """Every replica of the model at once (both, with the shipped standby): nothing left
    to hand over to, so requests are refused with 503 until Serve's replacements are up."""
    llm = models["generation"][0]
    await until_one_stands_by(server, llm, STANDBY_BACK_WITHIN_S)
    pid = await serving_replica(server, llm)
    pids = await asyncio.to_thread(model_replica_pids, server, llm)
    assert pid in pids, (pid, pids)
    assert all(owned(server, p) for p in pids), pids
    run = await kill_under_load(server, llm, pids)
    new_pid = await asyncio.to_thread(replica_pid, server.url, llm)
    record_kill("replica_kill", llm, pids, new_pid, run)
    assert new_pid not in pids, "a killed replica was not replaced"
    assert_answered_as_promised(run)
    turned = run.health_not_ok_s()
    assert turned is not None and turned < HEALTH_TURNS_WITHIN_S, (
        f"/healthz turned only {turned} s after the kill"
    )


async def two_chats(server: Server, model: str, stopped: list[int]) -> list[tuple[int, float]]:
    """Two chats in a row, each timed, while the processes `stopped` are held by SIGSTOP;
    they go on afterwards whatever happens."""
    body = chat_body(model, max_tokens=4)
    headers = {"X-Request-Timeout": str(DEADLINE_S)}
    url = f"{server.url}/v1/chat/completions"
    answers = []
    async with httpx.AsyncClient(timeout=DEADLINE_S + 30) as client:
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            for _ in range(2):
                started = time.monotonic()
                answer = await client.post(url, json=body, headers=headers)
                if answer.status_code != 200:
                    assert answer.headers.get("retry-after"), answer.text
                answers.append((answer.status_code, round(time.monotonic() - started, 2)))
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
    return answers


@pytest.mark.timeout(int(STANDBY_BACK_WITHIN_S + 120))
async def test_a_hung_replica_is_passed_over_for_the_standby_and_refused_without_one(
    server: Server, models: dict[str, list[str]]
) -> None:
    """A replica that hangs fails no call, and Serve's router keeps sending it calls until
    its health check gives up (30 s). The first request finds out by its wait for a first
    token (the replica watch's question): with the standby running, that request is sent
    again to the standby and answered, and the next goes there at once. With every replica
    hung, the first request is refused within seconds, not at its deadline, and the next
    at once; the model serves again once they go on."""
    llm = models["generation"][0]
    await until_one_stands_by(server, llm, STANDBY_BACK_WITHIN_S)
    pid = await serving_replica(server, llm)
    handed_over = await two_chats(server, llm, [pid])
    pids = await asyncio.to_thread(model_replica_pids, server, llm)
    roles = await asyncio.to_thread(roles_in_stats, server, llm)
    refused = await two_chats(server, llm, pids)
    report.record("replica_hang", {"standby": handed_over, "all_hung": refused, "roles": roles})
    (first, first_s), (second, second_s) = handed_over
    assert first == 200 and first_s < STALL_PROBE_S + PROBE_TIMEOUT_S + 2, handed_over
    assert second == 200 and second_s < 1, handed_over
    assert roles["passed_over"] == 1, roles
    (first, first_s), (second, second_s) = refused
    # The serving replica's question, and the other's if it was not passed over already.
    assert first == 503 and first_s < STALL_PROBE_S + 2 * PROBE_TIMEOUT_S + 2, refused
    assert second == 503 and second_s < 1, refused
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
