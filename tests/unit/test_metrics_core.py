"""core.metrics: what each event records, and the names Prometheus will see."""

from __future__ import annotations

import re

import pytest

from deployments.core.batching.cost_model import CostFit
from deployments.core.metrics.metrics import (
    BATCH_ITEMS,
    BATCH_SIZE,
    BATCH_TOKENS,
    DEVICE_MEMORY,
    DEVICE_UTILIZATION,
    DROPPED_ITEMS,
    INFERENCE,
    MODEL_BUSY,
    OUTPUT_TOKENS,
    QUEUE_WAIT,
    REJECTIONS,
    REQUEST_LATENCY,
    REQUESTS,
    RUNNING_SEQUENCES,
    SERIES,
    TIME_TO_FIRST_TOKEN,
    TOKEN_CEILING,
    WAITING_SEQUENCES,
    Kind,
    MemoryRecorder,
    TributaryMetrics,
    rejection_reason,
)


@pytest.fixture
def recorded() -> tuple[TributaryMetrics, MemoryRecorder]:
    recorder = MemoryRecorder()
    return TributaryMetrics(recorder), recorder


def test_every_record_carries_exactly_its_series_labels(
    recorded: tuple[TributaryMetrics, MemoryRecorder],
) -> None:
    metrics, recorder = recorded
    metrics.request_finished("m", "2", "normal", 429, "load_shed", 0.5)
    metrics.request_finished("m", "2", "normal", 200, None, 0.1)
    metrics.queue_depth("m", "batch", 7)
    metrics.batch_ran("m", "normal", 4, 64, 0.02, [0.01, 0.03])
    metrics.items_dropped("m", "batch", "deadline", 3)
    metrics.batch_plan("m", "batch", 4096, 0.0)
    metrics.memory_faults("m", "split_retry", 2)
    metrics.device("m", {"total": 8 << 30, "free": 4 << 30, "process": None}, 37.0, 2048)
    metrics.cost_model("m", CostFit(0.004, 0.0001, 0.00001, 32))
    metrics.cache_lookup("m", hit=True)
    metrics.cache_store("m", 4096, new_evictions=1)
    metrics.cache_error("m", "read")
    metrics.first_token("llm", "realtime", 0.2)
    metrics.inter_token("llm", 0.02)
    metrics.sequences("llm", running=5, waiting=2)
    metrics.output_tokens("llm", "normal", 17)
    metrics.traffic_weight("m", "2", 0.1)
    metrics.shadow_compared("m", "2", {"cosine": 0.999}, 1.2)
    metrics.shadow_not_compared("m", "2", "dropped")
    metrics.canary_tripped("m", "2", "p99")
    metrics.batch_lines("completed", 3)
    metrics.batch_finished("completed", 12.0)
    metrics.batch_lines_waiting(40)
    metrics.device_turn("m", "realtime", 0.001, 0.02)
    metrics.device_share("m", 0.25)
    metrics.device_paused("m", 2, 0.012)
    assert {s.name for s, _, _ in recorder.records} == {s.name for s in SERIES}
    for series, _, labels in recorder.records:
        assert tuple(labels) == series.labels, series.name
        assert all(isinstance(v, str) and v for v in labels.values())


def test_device_figures_that_are_not_known_are_left_out(
    recorded: tuple[TributaryMetrics, MemoryRecorder],
) -> None:
    metrics, recorder = recorded
    metrics.device("m", {"total": 100, "free": 40, "process": 25}, None, None)
    assert recorder.values(DEVICE_MEMORY, kind="process") == [25]
    assert recorder.values(DEVICE_UTILIZATION) == [] and recorder.values(TOKEN_CEILING) == []
    metrics.device("m", {"process": None}, 12.0, 4096)
    assert recorder.values(DEVICE_UTILIZATION) == [12.0]
    assert recorder.values(TOKEN_CEILING, model="m") == [4096]


def test_a_finished_request_is_counted_timed_only_if_answered_and_rejected_by_reason(
    recorded: tuple[TributaryMetrics, MemoryRecorder],
) -> None:
    metrics, recorder = recorded
    metrics.request_finished("m", "1", "batch", 429, "load_shed", 0.5)
    metrics.request_finished("m", "1", "batch", 200, None, 0.25)
    metrics.request_finished("m", "1", "batch", 400, "invalid_request_error", 0.01)
    assert recorder.values(REQUESTS, status="429") == [1]
    assert recorder.values(REQUESTS, model_version="1", priority="batch") == [1, 1, 1]
    assert recorder.values(REQUEST_LATENCY) == [0.25]
    assert recorder.values(REJECTIONS, reason="shed", priority="batch") == [1]
    assert len(recorder.values(REJECTIONS)) == 1  # bad input is an error, not a rejection


def test_a_batch_records_size_padded_tokens_time_and_one_wait_per_job(
    recorded: tuple[TributaryMetrics, MemoryRecorder],
) -> None:
    metrics, recorder = recorded
    metrics.batch_ran("m", "realtime", 3, 48, 0.02, [0.004, 0.001])
    labels = {"model": "m", "priority": "realtime"}
    assert recorder.values(BATCH_SIZE, **labels) == [3]
    assert recorder.values(BATCH_ITEMS, **labels) == [3]
    assert recorder.values(BATCH_TOKENS, **labels) == [48]
    assert recorder.values(INFERENCE, **labels) == [0.02]
    assert recorder.values(MODEL_BUSY, **labels) == [0.02]
    assert recorder.values(QUEUE_WAIT, **labels) == [0.004, 0.001]
    metrics.items_dropped("m", "realtime", "client_gone", 2)
    assert recorder.values(DROPPED_ITEMS, reason="client_gone") == [2]


def test_generation_series_for_the_llm_deployment(
    recorded: tuple[TributaryMetrics, MemoryRecorder],
) -> None:
    metrics, recorder = recorded
    metrics.first_token("llm", "realtime", 0.3)
    metrics.sequences("llm", running=8, waiting=3)
    metrics.output_tokens("llm", "realtime", 40)
    assert recorder.values(TIME_TO_FIRST_TOKEN, model="llm", priority="realtime") == [0.3]
    assert recorder.values(RUNNING_SEQUENCES, model="llm") == [8]
    assert recorder.values(WAITING_SEQUENCES, model="llm") == [3]
    assert recorder.values(OUTPUT_TOKENS, model="llm") == [40]


@pytest.mark.parametrize(
    ("status", "code", "reason"),
    [
        (429, "rate_limit_exceeded", "rate_limit"),
        (429, "load_shed", "shed"),
        (503, "queue_full", "queue_full"),
        (429, "queue_full", "queue_full"),
        (504, "deadline_exceeded", "deadline"),
        (499, None, "client_gone"),
        (200, None, None),
        (400, "invalid_request_error", None),
        (503, "not_ready", None),
        (500, "model_error", None),
    ],
)
def test_rejection_reasons(status: int, code: str | None, reason: str | None) -> None:
    assert rejection_reason(status, code) == reason


def test_exported_names_follow_ray_and_prometheus_conventions() -> None:
    assert REQUESTS.exported_names() == {"ray_tributary_requests_total"}
    assert BATCH_SIZE.exported_names() == {
        "ray_tributary_batch_size_bucket",
        "ray_tributary_batch_size_sum",
        "ray_tributary_batch_size_count",
    }
    assert RUNNING_SEQUENCES.exported_names() == {"ray_tributary_running_sequences"}
    names = [s.name for s in SERIES]
    assert len(set(names)) == len(names)
    for series in SERIES:
        assert re.fullmatch(r"tributary_[a-z_]+", series.name)
        # Serve adds these itself and refuses a metric that declares them.
        assert not {"deployment", "replica", "application", "route"} & set(series.labels)
        if series.kind is Kind.HISTOGRAM:
            assert list(series.buckets) == sorted(series.buckets) and series.buckets[0] > 0
