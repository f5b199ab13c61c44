"""The stop note's routing (ingress/calls/stop_note_router.py): which replica runs which
generation, remembered by stop key, bounded, and forgotten when the call completes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from deployments.ingress.calls.stop_note_router import (
    GENERATE,
    STOP_SEQUENCE,
    RunsByStopKey,
    replica_for_note,
    stop_key_of,
)


def call(method: str, *args: Any, **kwargs: Any) -> Any:
    return SimpleNamespace(
        metadata=SimpleNamespace(call_method=method, internal_request_id=f"id-{args}"),
        args=list(args),
        kwargs=kwargs,
    )


def replica(name: str) -> Any:
    return SimpleNamespace(replica_id=name)


def test_the_stop_key_is_read_where_each_method_carries_it() -> None:
    assert stop_key_of(call(GENERATE, "normal", object(), 10.0, "k1"), GENERATE) == "k1"
    assert stop_key_of(call(STOP_SEQUENCE, "k1"), STOP_SEQUENCE) == "k1"
    assert stop_key_of(call(STOP_SEQUENCE, stop_key="k2"), STOP_SEQUENCE) == "k2"
    # Another method, or a generate call made without a key, carries none.
    assert stop_key_of(call("info"), STOP_SEQUENCE) is None
    assert stop_key_of(call(GENERATE, "normal", object(), 10.0), GENERATE) is None
    assert stop_key_of(call(STOP_SEQUENCE, 7), STOP_SEQUENCE) is None


def test_a_note_goes_to_the_replica_that_runs_its_generation() -> None:
    runs = RunsByStopKey()
    a, b = replica("a"), replica("b")
    runs.ran("k1", "b", "request-1")
    assert replica_for_note([a, b], call(STOP_SEQUENCE, "k1"), runs) is b
    # A key nobody runs, a replica that is no longer a candidate, a call that is no note:
    # routed as Serve would.
    assert replica_for_note([a, b], call(STOP_SEQUENCE, "k9"), runs) is None
    assert replica_for_note([a], call(STOP_SEQUENCE, "k1"), runs) is None
    assert replica_for_note([a, b], call(GENERATE, "normal", None, 1.0, "k1"), runs) is None
    assert replica_for_note([a, b], None, runs) is None


def test_a_run_is_forgotten_when_its_call_completes() -> None:
    runs = RunsByStopKey()
    runs.ran("k1", "a", "request-1")
    runs.ran("k2", "b", "request-2")
    runs.ended("request-1")
    runs.ended("request-unknown")
    assert runs.replica_of("k1") is None
    assert runs.replica_of("k2") == "b"
    assert len(runs) == 1


def test_what_it_remembers_is_bounded_oldest_first() -> None:
    runs = RunsByStopKey(limit=3)
    for n in range(5):
        runs.ran(f"k{n}", "a", f"request-{n}")
    assert len(runs) == 3
    assert runs.replica_of("k0") is None and runs.replica_of("k1") is None
    assert runs.replica_of("k4") == "a"
    runs.ended("request-0")  # its key was dropped already: nothing else goes with it
    assert len(runs) == 3
