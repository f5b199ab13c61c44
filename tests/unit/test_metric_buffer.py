"""The buffered recorder: what it hands on equals what was recorded, summed or last."""

from __future__ import annotations

import time

from deployments.core.metrics.metric_buffer import BufferedRecorder
from deployments.core.metrics.metric_series import QUEUE_DEPTH, REQUEST_LATENCY, REQUESTS
from deployments.core.metrics.metrics import MemoryRecorder, TributaryMetrics

LABELS = {"model": "m", "model_version": "1", "priority": "normal"}


def test_counters_sum_gauges_keep_the_last_histograms_keep_every_value() -> None:
    inner = MemoryRecorder()
    buffered = BufferedRecorder(inner, flush_every_s=3600)
    for latency in (0.01, 0.02, 0.03):
        buffered.record(REQUESTS, 1, {**LABELS, "status": "200"})
        buffered.record(REQUEST_LATENCY, latency, LABELS)
    buffered.record(REQUESTS, 1, {**LABELS, "status": "429"})
    for depth in (5, 9, 2):
        buffered.record(QUEUE_DEPTH, depth, {"model": "m", "priority": "normal"})
    assert inner.records == []  # nothing before the flush
    buffered.flush()
    assert inner.values(REQUESTS, status="200") == [3]
    assert inner.values(REQUESTS, status="429") == [1]
    assert inner.values(REQUEST_LATENCY) == [0.01, 0.02, 0.03]
    assert inner.values(QUEUE_DEPTH) == [2]
    buffered.flush()  # a second flush with nothing new hands on nothing
    assert len(inner.records) == 6
    buffered.stop()


def test_labels_keep_their_own_totals() -> None:
    inner = MemoryRecorder()
    metrics = TributaryMetrics(BufferedRecorder(inner, flush_every_s=3600))
    metrics.request_finished("a", "1", "normal", 200, None, 0.1)
    metrics.request_finished("b", "1", "normal", 200, None, 0.1)
    metrics.request_finished("a", "1", "normal", 200, None, 0.1)
    assert isinstance(metrics.recorder, BufferedRecorder)
    metrics.recorder.stop()
    assert inner.values(REQUESTS, model="a") == [2]
    assert inner.values(REQUESTS, model="b") == [1]


def test_the_background_thread_flushes_without_being_asked() -> None:
    inner = MemoryRecorder()
    buffered = BufferedRecorder(inner, flush_every_s=0.02)
    buffered.record(QUEUE_DEPTH, 7, {"model": "m", "priority": "batch"})
    _wait_for_a_record(inner)
    assert inner.values(QUEUE_DEPTH, priority="batch") == [7]
    buffered.stop()


def test_a_failing_inner_recorder_does_not_stop_the_flushing() -> None:
    class Flaky(MemoryRecorder):
        failed = False

        def record(self, series, value, labels):  # type: ignore[no-untyped-def]
            if not self.failed:
                self.failed = True
                raise RuntimeError("the metrics agent is away")
            super().record(series, value, labels)

    inner = Flaky()
    buffered = BufferedRecorder(inner, flush_every_s=0.02)
    buffered.record(QUEUE_DEPTH, 1, {"model": "m", "priority": "batch"})
    # Until the flush that fails has run: a gauge keeps its last value, so a 3 recorded
    # before it would be the value that fails, and nothing would be left to hand on.
    deadline = time.monotonic() + 5
    while not inner.failed and time.monotonic() < deadline:
        time.sleep(0.01)
    buffered.record(QUEUE_DEPTH, 3, {"model": "m", "priority": "batch"})
    _wait_for_a_record(inner)
    assert inner.values(QUEUE_DEPTH, priority="batch") == [3]
    buffered.stop()


def _wait_for_a_record(inner: MemoryRecorder, timeout_s: float = 5) -> None:
    deadline = time.monotonic() + timeout_s
    while not inner.records and time.monotonic() < deadline:
        time.sleep(0.01)
