"""Where an embedding or rerank request's time went, on its answer: TEI's headers
(`x-total-time`, `x-tokenization-time`, `x-queue-time`, `x-inference-time`, whole
milliseconds, as TEI sends them) and the W3C `Server-Timing` header with the same figures
to a hundredth of a millisecond, which browsers' developer tools show.

total: from the request's arrival at the ingress to its answer being ready (encoding the
body and sending it are not in it). queue: from that arrival to the first forward pass
that computed one of its inputs (the ingress's admission and batching, the hop to the
replica, the replica's queue). inference: the forward passes that computed its inputs.
tokenization: its share of its call's tokenising in the replica. What total has beyond
queue and inference is the way back. An answer the result cache gave whole has only
total; a client's own measure beyond total is the network, HAProxy and its own loop.
"""

from __future__ import annotations

from deployments.core.protocol import JobTiming

TOTAL_HEADER = "x-total-time"
TOKENIZATION_HEADER = "x-tokenization-time"
QUEUE_HEADER = "x-queue-time"
INFERENCE_HEADER = "x-inference-time"
SERVER_TIMING_HEADER = "Server-Timing"


def timing_headers(total_s: float, timing: JobTiming | None) -> dict[str, str]:
    """The headers for an answer ready `total_s` after its request arrived."""
    figures = {"total": total_s}
    if timing is not None:
        figures |= {
            "tokenization": timing.tokenize_s,
            "queue": timing.queue_s,
            "inference": timing.inference_s,
        }
    headers = {f"x-{name}-time": str(int(seconds * 1e3)) for name, seconds in figures.items()}
    headers[SERVER_TIMING_HEADER] = ", ".join(
        f"{name};dur={seconds * 1e3:.2f}" for name, seconds in figures.items()
    )
    return headers
