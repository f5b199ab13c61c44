"""What Tributary measures, and the narrow interface it measures through.

Every series is declared once in `SERIES` (name, kind, labels, buckets). Code records
through `TributaryMetrics`, whose methods name what happened ("a batch ran", "a request
finished"); it hands values to a `Recorder`, which is the only part that knows where
they go. `deployments/metrics.py` is the Recorder onto `ray.serve.metrics` (exported to
Prometheus as `ray_<name>`, counters with `_total`); tests use `MemoryRecorder`. Keeping
Ray out of this module lets core/ and its tests run without it, and lets the dashboard
test derive the exported names from these declarations.

Label values are bounded sets: model names from the config, priority classes, HTTP
statuses and the reasons below. A request refused before its model was known (bad JSON,
unknown model) is labelled `model="unknown"`, never with the name a client sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from deployments.core.batching.cost_model import CostFit
from deployments.core.metrics.metric_series import (
    AGREEMENT_BUCKETS,
    BATCH_ITEMS,
    BATCH_JOB_LINES,
    BATCH_JOB_SECONDS,
    BATCH_JOB_WAITING,
    BATCH_SIZE,
    BATCH_TOKEN_BUDGET,
    BATCH_TOKENS,
    BATCH_WAIT,
    CACHE_BYTES,
    CACHE_ERRORS,
    CACHE_EVICTIONS,
    CACHE_LOOKUPS,
    CANARY_TRIPS,
    CLIENT_GONE,
    CLIENT_GONE_STATUS,
    COST_MODEL,
    DEADLINE,
    DEVICE_HELD,
    DEVICE_MEMORY,
    DEVICE_PAUSED,
    DEVICE_PAUSES,
    DEVICE_SHARE,
    DEVICE_TURN_WAIT,
    DEVICE_TURNS,
    DEVICE_UTILIZATION,
    DROPPED_ITEMS,
    INFERENCE,
    INTER_TOKEN_LATENCY,
    MEMORY_FAULTS,
    MODEL_BUSY,
    MODEL_CLASS,
    OUTPUT_TOKENS,
    QUEUE_DEPTH,
    QUEUE_FULL,
    QUEUE_WAIT,
    RATE_LIMIT,
    REJECTIONS,
    REQUEST_LATENCY,
    REQUESTS,
    RUNNING_SEQUENCES,
    SECONDS_BUCKETS,
    SERIES,
    SHADOW_AGREEMENT,
    SHADOW_COPIES,
    SHADOW_LATENCY_RATIO,
    SHED,
    SIZE_BUCKETS,
    TIME_TO_FIRST_TOKEN,
    TOKEN_BUCKETS,
    TOKEN_CEILING,
    TRAFFIC_WEIGHT,
    UNKNOWN,
    WAITING_SEQUENCES,
    Kind,
    Series,
)

# The series are declared in metric_series.py; code and tests import them from here.
__all__ = [
    "AGREEMENT_BUCKETS",
    "BATCH_ITEMS",
    "BATCH_SIZE",
    "BATCH_TOKENS",
    "BATCH_TOKEN_BUDGET",
    "BATCH_WAIT",
    "CACHE_BYTES",
    "CACHE_ERRORS",
    "CACHE_EVICTIONS",
    "CACHE_LOOKUPS",
    "CANARY_TRIPS",
    "CLIENT_GONE",
    "CLIENT_GONE_STATUS",
    "COST_MODEL",
    "DEADLINE",
    "DEVICE_HELD",
    "DEVICE_MEMORY",
    "DEVICE_PAUSED",
    "DEVICE_PAUSES",
    "DEVICE_SHARE",
    "DEVICE_TURNS",
    "DEVICE_TURN_WAIT",
    "DEVICE_UTILIZATION",
    "DROPPED_ITEMS",
    "INFERENCE",
    "INTER_TOKEN_LATENCY",
    "MEMORY_FAULTS",
    "MODEL_BUSY",
    "MODEL_CLASS",
    "OUTPUT_TOKENS",
    "QUEUE_DEPTH",
    "QUEUE_FULL",
    "QUEUE_WAIT",
    "RATE_LIMIT",
    "REJECTIONS",
    "REQUESTS",
    "REQUEST_LATENCY",
    "RUNNING_SEQUENCES",
    "SECONDS_BUCKETS",
    "SERIES",
    "SHADOW_AGREEMENT",
    "SHADOW_COPIES",
    "SHADOW_LATENCY_RATIO",
    "SHED",
    "SIZE_BUCKETS",
    "TIME_TO_FIRST_TOKEN",
    "TOKEN_BUCKETS",
    "TOKEN_CEILING",
    "TRAFFIC_WEIGHT",
    "UNKNOWN",
    "WAITING_SEQUENCES",
    "Kind",
    "MemoryRecorder",
    "NullRecorder",
    "Recorder",
    "Series",
    "TributaryMetrics",
    "rejection_reason",
]


class Recorder(Protocol):
    """Where values go. `labels` always has exactly the series' label names."""

    def record(self, series: Series, value: float, labels: Mapping[str, str]) -> None:
        """Counter: add `value`; histogram: observe it; gauge: set it."""
        ...


class NullRecorder:
    def record(self, series: Series, value: float, labels: Mapping[str, str]) -> None:
        return None


@dataclass
class MemoryRecorder:
    """Keeps every record, for tests: `values(series, **labels)` lists what matched."""

    records: list[tuple[Series, float, dict[str, str]]] = field(default_factory=list)

    def record(self, series: Series, value: float, labels: Mapping[str, str]) -> None:
        self.records.append((series, value, dict(labels)))

    def values(self, series: Series, **labels: str) -> list[float]:
        return [
            value
            for s, value, got in self.records
            if s is series and all(got.get(k) == v for k, v in labels.items())
        ]


def rejection_reason(status: int, code: str | None) -> str | None:
    """Why a request got no result, from its final status and error code; None when it
    got one or failed for another reason (bad input, a model error)."""
    if status == CLIENT_GONE_STATUS:
        return CLIENT_GONE
    if status == 504:
        return DEADLINE
    if code == "rate_limit_exceeded":
        return RATE_LIMIT
    if code == "load_shed":
        return SHED
    if code == "queue_full":
        return QUEUE_FULL
    return None


class TributaryMetrics:
    """Named events onto the declared series. Cheap enough to call per request and per
    batch; never raises on the request path's behalf (a Recorder's own errors aside)."""

    def __init__(self, recorder: Recorder | None = None) -> None:
        self.recorder: Recorder = recorder or NullRecorder()

    def _put(self, series: Series, value: float, **labels: str) -> None:
        self.recorder.record(series, value, labels)

    # Ingress: one call per finished request, and the queues it went through.
    def request_finished(
        self,
        model: str,
        version: str,
        priority: str,
        status: int,
        code: str | None,
        latency_s: float,
    ) -> None:
        self._put(
            REQUESTS, 1, model=model, model_version=version, priority=priority, status=str(status)
        )
        if status < 400:
            self._put(
                REQUEST_LATENCY, latency_s, model=model, model_version=version, priority=priority
            )
        reason = rejection_reason(status, code)
        if reason is not None:
            self._put(
                REJECTIONS, 1, model=model, model_version=version, priority=priority, reason=reason
            )

    def queue_depth(self, model: str, priority: str, items: int) -> None:
        self._put(QUEUE_DEPTH, items, model=model, priority=priority)

    # Model replica: one call per forward pass, and per input dropped before one.
    def batch_ran(
        self,
        model: str,
        priority: str,
        size: int,
        padded_tokens: int,
        inference_s: float,
        queue_waits_s: list[float],
    ) -> None:
        self._put(BATCH_SIZE, size, model=model, priority=priority)
        self._put(BATCH_ITEMS, size, model=model, priority=priority)
        self._put(BATCH_TOKENS, padded_tokens, model=model, priority=priority)
        self._put(INFERENCE, inference_s, model=model, priority=priority)
        self._put(MODEL_BUSY, inference_s, model=model, priority=priority)
        self.queue_waits(model, priority, queue_waits_s)

    def queue_waits(self, model: str, priority: str, queue_waits_s: list[float]) -> None:
        """How long a pass's jobs of the class waited at the replica (a class's jobs
        carried in another class's pass are recorded here alone)."""
        for wait in queue_waits_s:
            self._put(QUEUE_WAIT, wait, model=model, priority=priority)

    def batch_plan(self, model: str, priority: str, max_batch_tokens: int, wait_s: float) -> None:
        self._put(BATCH_TOKEN_BUDGET, max_batch_tokens, model=model, priority=priority)
        self._put(BATCH_WAIT, wait_s, model=model, priority=priority)

    def cost_model(self, model: str, fit: CostFit) -> None:
        self._put(COST_MODEL, fit.intercept_s, model=model, term="intercept")
        self._put(COST_MODEL, fit.per_row_s, model=model, term="per_row")
        self._put(COST_MODEL, fit.per_token_s, model=model, term="per_token")

    def memory_faults(self, model: str, event: str, count: int) -> None:
        if count:
            self._put(MEMORY_FAULTS, count, model=model, event=event)

    def device(
        self,
        model: str,
        bytes_by_kind: Mapping[str, int | None],
        utilization_percent: float | None,
        token_ceiling: int | None,
    ) -> None:
        for kind, value in bytes_by_kind.items():
            if value is not None:
                self._put(DEVICE_MEMORY, value, model=model, kind=kind)
        if utilization_percent is not None:
            self._put(DEVICE_UTILIZATION, utilization_percent, model=model)
        if token_ceiling is not None:
            self._put(TOKEN_CEILING, token_ceiling, model=model)

    def device_turn(self, model: str, priority: str, waited_s: float, held_s: float) -> None:
        """A turn at the shared device, given back."""
        self._put(DEVICE_TURNS, 1, model=model, priority=priority)
        self._put(DEVICE_TURN_WAIT, waited_s, model=model, priority=priority)
        self._put(DEVICE_HELD, held_s, model=model, priority=priority)

    def device_share(self, model: str, share: float) -> None:
        self._put(DEVICE_SHARE, share, model=model)

    def device_paused(self, model: str, passes: int, seconds: float) -> None:
        """A realtime pass of `model` ended that had stopped `passes` others' passes."""
        self._put(DEVICE_PAUSES, passes, model=model)
        self._put(DEVICE_PAUSED, seconds, model=model)

    def items_dropped(self, model: str, priority: str, reason: str, count: int) -> None:
        self._put(DROPPED_ITEMS, count, model=model, priority=priority, reason=reason)

    def cache_lookup(self, model: str, hit: bool) -> None:
        self._put(CACHE_LOOKUPS, 1, model=model, result="hit" if hit else "miss")

    # Versions: the split, shadow copies and the canary guard (ingress).
    def traffic_weight(self, model: str, version: str, share: float) -> None:
        self._put(TRAFFIC_WEIGHT, share, model=model, model_version=version)

    def shadow_compared(
        self, model: str, version: str, agreements: Mapping[str, float], latency_ratio: float
    ) -> None:
        self._put(SHADOW_COPIES, 1, model=model, model_version=version, result="compared")
        for measure, value in agreements.items():
            self._put(SHADOW_AGREEMENT, value, model=model, model_version=version, measure=measure)
        self._put(SHADOW_LATENCY_RATIO, latency_ratio, model=model, model_version=version)

    def shadow_not_compared(self, model: str, version: str, result: str) -> None:
        self._put(SHADOW_COPIES, 1, model=model, model_version=version, result=result)

    def canary_tripped(self, model: str, version: str, reason: str) -> None:
        self._put(CANARY_TRIPS, 1, model=model, model_version=version, reason=reason)

    def cache_lookups(self, model: str, hits: int, misses: int) -> None:
        # One request's items at once: a counter per input would cost a call per text.
        if hits:
            self._put(CACHE_LOOKUPS, hits, model=model, result="hit")
        if misses:
            self._put(CACHE_LOOKUPS, misses, model=model, result="miss")

    def cache_store(self, model: str, used_bytes: int, new_evictions: int) -> None:
        self._put(CACHE_BYTES, used_bytes, model=model)
        if new_evictions:
            self._put(CACHE_EVICTIONS, new_evictions, model=model)

    def cache_error(self, model: str, operation: str) -> None:
        self._put(CACHE_ERRORS, 1, model=model, operation=operation)

    # Generation (the LLM deployment).
    def first_token(self, model: str, priority: str, seconds: float) -> None:
        self._put(TIME_TO_FIRST_TOKEN, seconds, model=model, priority=priority)

    def inter_token(self, model: str, seconds: float) -> None:
        self._put(INTER_TOKEN_LATENCY, seconds, model=model)

    def sequences(self, model: str, running: int, waiting: int) -> None:
        self._put(RUNNING_SEQUENCES, running, model=model)
        self._put(WAITING_SEQUENCES, waiting, model=model)

    def output_tokens(self, model: str, priority: str, tokens: int) -> None:
        self._put(OUTPUT_TOKENS, tokens, model=model, priority=priority)

    # The Batch API's dispatcher.
    def batch_lines(self, result: str, count: int) -> None:
        self._put(BATCH_JOB_LINES, count, result=result)

    def batch_finished(self, status: str, seconds: float) -> None:
        self._put(BATCH_JOB_SECONDS, seconds, status=status)

    def batch_lines_waiting(self, lines: int) -> None:
        self._put(BATCH_JOB_WAITING, lines)
