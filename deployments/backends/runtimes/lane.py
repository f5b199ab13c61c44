"""The realtime lane's forward: the model as the lane's thread runs it.

A replica with a realtime lane runs a realtime batch on a thread of its own while another
pass holds the model's threads (core/batching/priority_gate.py). That thread must not share
the other pass's threads: torch gives each calling thread its own thread count, but a
compiled OpenVINO model with one stream queues a second call behind the first, and an ONNX
Runtime session shares one pool between its callers. So the lane gets a forward of its own,
built for few threads (torch's is the model's own), and the model's `forward` becomes a
`LaneRoutedForward` that sends each call to the lane's forward on the lane's thread and to
the main one everywhere else: the tasks call `forward` as before.

Measured on a 2-core Xeon, MiniLM on OpenVINO f32 (single texts every 30 ms while 49-text
passes ran back to back): a single text took p50 / p99 102 / 279 ms waiting its turn behind
the pass, 9.4 / 22 ms on a one-thread lane beside it; the passes lost 7 % of their texts a
second in that run, 26 % in a second one on a slower moment (docs/backends.md).
"""

from __future__ import annotations

import threading

import numpy as np

from deployments.backends.runtimes.build import Features, Forward


def lane_threads(threads: int) -> int:
    """The lane's share of the model's threads: one on a small CPU, a quarter on a big one
    (a realtime batch is small, and the pass beside it keeps the rest)."""
    return max(1, threads // 4)


class LaneRoutedForward:
    def __init__(self, main: Forward, lane: Forward, threads: int) -> None:
        """`threads`: what the lane's thread runs with (torch's count on that thread)."""
        self.main = main
        self.lane = lane
        self.threads = threads
        self._here = threading.local()

    def enter_lane(self) -> None:
        """Called on the lane's thread as it starts: its calls go to the lane's forward."""
        self._here.lane = True

    def __call__(self, features: Features) -> np.ndarray:
        forward = self.lane if getattr(self._here, "lane", False) else self.main
        return forward(features)


def routed_lane(forward: object) -> LaneRoutedForward | None:
    """The model's lane, where its forward was built with one."""
    return forward if isinstance(forward, LaneRoutedForward) else None
