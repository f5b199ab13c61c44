"""Every series Tributary exports, declared once: name, kind, labels, buckets.

`metrics.py` records onto these through `TributaryMetrics` and re-exports them; the
dashboard test derives the exported names from `SERIES`. Pure: no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(Enum):
    COUNTER = "counter"
    HISTOGRAM = "histogram"
    GAUGE = "gauge"


# Seconds, from a 1 ms realtime batch to a minute-long queue of batch-class work.
SECONDS_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
# Items per batch: powers of two up to the largest max_batch_size worth configuring.
SIZE_BUCKETS = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
# Padded tokens per batch (rows x longest row), the quantity max_batch_tokens caps.
TOKEN_BUCKETS = tuple(float(2**n) for n in range(4, 17))

UNKNOWN = "unknown"

# Rejection reasons (`tributary_rejections`): why a request was answered without a result.
RATE_LIMIT = "rate_limit"
SHED = "shed"
QUEUE_FULL = "queue_full"
DEADLINE = "deadline"
CLIENT_GONE = "client_gone"
# A client that leaves gets no answer; 499 is the status proxies log for that.
CLIENT_GONE_STATUS = 499


@dataclass(frozen=True)
class Series:
    name: str
    kind: Kind
    description: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    def exported_names(self, prefix: str = "ray_") -> set[str]:
        """The names Prometheus sees: Ray adds `ray_`; a counter is `_total`, a histogram
        is `_bucket`, `_sum` and `_count`."""
        base = prefix + self.name
        if self.kind is Kind.COUNTER:
            return {base + "_total"}
        if self.kind is Kind.HISTOGRAM:
            return {base + suffix for suffix in ("_bucket", "_sum", "_count")}
        return {base}


MODEL_CLASS = ("model", "priority")

REQUESTS = Series(
    "tributary_requests",
    Kind.COUNTER,
    "Finished API requests by model, model version, priority class and HTTP status.",
    ("model", "model_version", "priority", "status"),
)
REQUEST_LATENCY = Series(
    "tributary_request_latency_seconds",
    Kind.HISTOGRAM,
    "Time at the ingress from a parsed request to its answer, answered requests only.",
    ("model", "model_version", "priority"),
    SECONDS_BUCKETS,
)
QUEUE_WAIT = Series(
    "tributary_queue_wait_seconds",
    Kind.HISTOGRAM,
    "Time a request's inputs waited in the model replica (batch queue and priority gate) "
    "before their forward pass; one observation per request and batch.",
    MODEL_CLASS,
    SECONDS_BUCKETS,
)
INFERENCE = Series(
    "tributary_inference_seconds",
    Kind.HISTOGRAM,
    "Duration of one forward pass over a batch.",
    MODEL_CLASS,
    SECONDS_BUCKETS,
)
# Exact, unlike INFERENCE's `_sum`: its rate is the share of time the model computes,
# per replica, the figure that says whether another replica would help.
MODEL_BUSY = Series(
    "tributary_model_busy_seconds",
    Kind.COUNTER,
    "Seconds spent in forward passes, summed over passes side by side; its rate is the "
    "model's busy fraction (1 = always busy, up to passes_in_flight).",
    MODEL_CLASS,
)
# Turns at a device shared across models (core/device_turns): how long a pass waited for
# the device, how many turns, and the seconds held, whose rates give each model's share.
DEVICE_TURN_WAIT = Series(
    "tributary_device_turn_wait_seconds",
    Kind.HISTOGRAM,
    "How long a forward pass (an engine step for the LLM) waited for its turn at the device "
    "the model shares with other models.",
    MODEL_CLASS,
    SECONDS_BUCKETS,
)
DEVICE_TURNS = Series(
    "tributary_device_turns",
    Kind.COUNTER,
    "Turns taken at the shared device (one per forward pass or engine step).",
    MODEL_CLASS,
)
DEVICE_HELD = Series(
    "tributary_device_held_seconds",
    Kind.COUNTER,
    "Seconds the model held the shared device; its rate over the sum of all models' rates is "
    "the model's share of the device.",
    MODEL_CLASS,
)
DEVICE_SHARE = Series(
    "tributary_device_share",
    Kind.GAUGE,
    "The model's share of its device's recent busy time (decayed over share_window_s), as "
    "the arbiter ranks it against min_share.",
    ("model",),
)
DEVICE_PAUSED = Series(
    "tributary_device_paused_seconds",
    Kind.COUNTER,
    "Seconds the model's realtime passes kept other models' lower-class passes on its "
    "device stopped (device_arbiter.pause_for_realtime); counted when they are continued.",
    ("model",),
)
DEVICE_PAUSES = Series(
    "tributary_device_pauses",
    Kind.COUNTER,
    "Other models' passes the model's realtime passes stopped while they ran.",
    ("model",),
)
BATCH_SIZE = Series(
    "tributary_batch_size",
    Kind.HISTOGRAM,
    "Inputs computed in one forward pass (after dropping expired ones).",
    MODEL_CLASS,
    SIZE_BUCKETS,
)
# Ray exports a histogram's `_sum` approximated from its bucket midpoints (its buckets
# and `_count` are exact), so a mean batch size needs this exact count of inputs.
BATCH_ITEMS = Series(
    "tributary_batch_items",
    Kind.COUNTER,
    "Inputs computed in forward passes; over tributary_batch_size_count, the mean batch size.",
    MODEL_CLASS,
)
BATCH_TOKENS = Series(
    "tributary_batch_tokens",
    Kind.HISTOGRAM,
    "Padded tokens of one forward pass: rows times the longest row.",
    MODEL_CLASS,
    TOKEN_BUCKETS,
)
BATCH_TOKEN_BUDGET = Series(
    "tributary_batch_token_budget",
    Kind.GAUGE,
    "Padded tokens a class's next batch may hold: the configured max_batch_tokens, or "
    "less where the batch policy lowered it for a latency target.",
    MODEL_CLASS,
)
BATCH_WAIT = Series(
    "tributary_batch_wait_seconds",
    Kind.GAUGE,
    "How long a class's next partial batch may wait for more inputs: the configured "
    "batch_wait_timeout_s, or 0 while the class is too quiet to fill a batch.",
    MODEL_CLASS,
)
COST_MODEL = Series(
    "tributary_cost_model_seconds",
    Kind.GAUGE,
    "A replica's fitted forward-pass cost, seconds ~ intercept + per_row x rows + "
    "per_token x padded tokens, by term.",
    ("model", "term"),
)
MEMORY_FAULTS = Series(
    "tributary_memory_faults",
    Kind.COUNTER,
    "Forward passes that ran out of memory (out_of_memory), of them the ones split in halves "
    "and retried (split_retry), and inputs that ran out of memory alone and failed with a "
    "413 (failed_alone).",
    ("model", "event"),
)
DEVICE_MEMORY = Series(
    "tributary_device_memory_bytes",
    Kind.GAUGE,
    "A model replica's device memory by kind: total and free of the device (the GPU, or the "
    "machine's memory on a CPU) and process (torch's allocation on a GPU, the RSS on a CPU).",
    ("model", "kind"),
)
DEVICE_UTILIZATION = Series(
    "tributary_device_utilization_percent",
    Kind.GAUGE,
    "A model replica's GPU busy percent as NVML samples it; absent on a CPU or without pynvml.",
    ("model",),
)
TOKEN_CEILING = Series(
    "tributary_token_ceiling",
    Kind.GAUGE,
    "Padded tokens one forward pass may hold by the replica's memory, measured at warm-up "
    "(memory_budget_mib, probe_memory_fraction); absent when memory bounds nothing.",
    ("model",),
)
QUEUE_DEPTH = Series(
    "tributary_queue_depth",
    Kind.GAUGE,
    "Inputs waiting at the ingress replica to be sent to the model, per class.",
    MODEL_CLASS,
)
REJECTIONS = Series(
    "tributary_rejections",
    Kind.COUNTER,
    "Requests answered without a result, by reason: rate_limit, shed, queue_full, "
    "deadline, client_gone.",
    ("model", "model_version", "priority", "reason"),
)
DROPPED_ITEMS = Series(
    "tributary_dropped_items",
    Kind.COUNTER,
    "Inputs a model replica dropped just before their forward pass: deadline or client_gone.",
    (*MODEL_CLASS, "reason"),
)
CACHE_LOOKUPS = Series(
    "tributary_cache_lookups",
    Kind.COUNTER,
    "Result-cache lookups by result (hit, miss); recorded once a deployment has a cache.",
    ("model", "result"),
)
# Shadow agreement: cosine, top-1 agreement, rank correlation, exact match, all in [-1, 1]
# and mostly near 1, where a candidate's trouble shows (Ray wants buckets above 0; lower
# values count in the first).
AGREEMENT_BUCKETS = (0.5, 0.8, 0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999, 1.0)
SHADOW_AGREEMENT = Series(
    "tributary_shadow_agreement",
    Kind.HISTOGRAM,
    "How a shadow version's answer agreed with the primary's, by measure: cosine "
    "(embeddings), top1 and rank_correlation (rerank), exact_match (greedy generation).",
    ("model", "model_version", "measure"),
    AGREEMENT_BUCKETS,
)
SHADOW_LATENCY_RATIO = Series(
    "tributary_shadow_latency_ratio",
    Kind.HISTOGRAM,
    "A shadow copy's latency over its primary request's (generation and every task).",
    ("model", "model_version"),
    (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0),
)
SHADOW_COPIES = Series(
    "tributary_shadow_copies",
    Kind.COUNTER,
    "Shadow copies by result: compared, dropped (bound or load), failed.",
    ("model", "model_version", "result"),
)
CANARY_TRIPS = Series(
    "tributary_canary_trips",
    Kind.COUNTER,
    "Canaries the guard stopped (weight 0), by reason: error_rate, p99, agreement.",
    ("model", "model_version", "reason"),
)
TRAFFIC_WEIGHT = Series(
    "tributary_traffic_weight",
    Kind.GAUGE,
    "Share of a model's new requests each version gets now (0 to 1), after the guard.",
    ("model", "model_version"),
)
CACHE_BYTES = Series(
    "tributary_cache_bytes",
    Kind.GAUGE,
    "Result cache, memory backend: bytes of entries held, per model and ingress replica.",
    ("model",),
)
CACHE_EVICTIONS = Series(
    "tributary_cache_evictions",
    Kind.COUNTER,
    "Result cache, memory backend: entries dropped to stay within max_bytes.",
    ("model",),
)
CACHE_ERRORS = Series(
    "tributary_cache_errors",
    Kind.COUNTER,
    "Result-cache store faults (Redis down, slow or refusing) by operation (read, write); "
    "each request went on without the cache.",
    ("model", "operation"),
)
TIME_TO_FIRST_TOKEN = Series(
    "tributary_time_to_first_token_seconds",
    Kind.HISTOGRAM,
    "Generation: from a request's arrival at the model to its first output token.",
    MODEL_CLASS,
    SECONDS_BUCKETS,
)
INTER_TOKEN_LATENCY = Series(
    "tributary_inter_token_latency_seconds",
    Kind.HISTOGRAM,
    "Generation: time between consecutive output tokens of one sequence.",
    ("model",),
    SECONDS_BUCKETS,
)
RUNNING_SEQUENCES = Series(
    "tributary_running_sequences",
    Kind.GAUGE,
    "Generation: sequences in the engine's running batch.",
    ("model",),
)
WAITING_SEQUENCES = Series(
    "tributary_waiting_sequences",
    Kind.GAUGE,
    "Generation: sequences admitted but waiting for a slot in the running batch.",
    ("model",),
)
OUTPUT_TOKENS = Series(
    "tributary_output_tokens",
    Kind.COUNTER,
    "Generation: tokens generated.",
    MODEL_CLASS,
)

# Batch jobs (the Batch API): lines by result, how long a batch took, lines still to run.
BATCH_JOB_LINES = Series(
    "tributary_batch_job_lines",
    Kind.COUNTER,
    "Batch API lines by result: completed (2xx), failed (answered otherwise, or never run), "
    "refused (429/503/504, sent again later).",
    ("result",),
)
BATCH_JOB_SECONDS = Series(
    "tributary_batch_job_seconds",
    Kind.HISTOGRAM,
    "Batch API jobs: seconds from creation to the end, by final status.",
    ("status",),
    (1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0),
)
BATCH_JOB_WAITING = Series(
    "tributary_batch_job_lines_waiting",
    Kind.GAUGE,
    "Batch API: lines of the batch this dispatcher runs that have no answer yet.",
    (),
)

SERIES: tuple[Series, ...] = (
    REQUESTS,
    SHADOW_AGREEMENT,
    SHADOW_LATENCY_RATIO,
    SHADOW_COPIES,
    CANARY_TRIPS,
    TRAFFIC_WEIGHT,
    REQUEST_LATENCY,
    QUEUE_WAIT,
    INFERENCE,
    MODEL_BUSY,
    DEVICE_TURN_WAIT,
    DEVICE_TURNS,
    DEVICE_HELD,
    DEVICE_SHARE,
    DEVICE_PAUSED,
    DEVICE_PAUSES,
    BATCH_SIZE,
    BATCH_ITEMS,
    BATCH_TOKENS,
    BATCH_TOKEN_BUDGET,
    BATCH_WAIT,
    COST_MODEL,
    MEMORY_FAULTS,
    DEVICE_MEMORY,
    DEVICE_UTILIZATION,
    TOKEN_CEILING,
    QUEUE_DEPTH,
    REJECTIONS,
    DROPPED_ITEMS,
    CACHE_LOOKUPS,
    CACHE_BYTES,
    CACHE_EVICTIONS,
    CACHE_ERRORS,
    TIME_TO_FIRST_TOKEN,
    INTER_TOKEN_LATENCY,
    RUNNING_SEQUENCES,
    WAITING_SEQUENCES,
    OUTPUT_TOKENS,
    BATCH_JOB_LINES,
    BATCH_JOB_SECONDS,
    BATCH_JOB_WAITING,
)
