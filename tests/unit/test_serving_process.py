"""A serving process's start-up tuning (core/serving_process.py): the generation replica
keeps CPython's collector thresholds, the others relax them; all shorten the GIL switch."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest

from deployments.core.gc_policy import THRESHOLDS
from deployments.core.serving_process import tune_serving_process
from deployments.core.thread_switch import SWITCH_INTERVAL_S


@pytest.fixture
def interpreter_restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("TRIBUTARY_TRACE_ALLOCATIONS", raising=False)
    monkeypatch.delenv("TRIBUTARY_SWITCH_INTERVAL_S", raising=False)
    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)


def test_a_replica_collects_less_and_switches_sooner(interpreter_restored: None) -> None:
    tune_serving_process("embedder")
    assert gc.get_threshold() == THRESHOLDS
    assert gc.get_freeze_count() > 0
    assert abs(sys.getswitchinterval() - SWITCH_INTERVAL_S) < 1e-9


def test_the_generator_keeps_the_collectors_thresholds(interpreter_restored: None) -> None:
    tune_serving_process("generate-llm", collect_less=False)
    assert gc.get_threshold() == (700, 10, 10)
    assert abs(sys.getswitchinterval() - SWITCH_INTERVAL_S) < 1e-9
