"""How soon a thread that waits for the GIL gets it, in a serving process.

A model replica runs Python on several threads at once: the pass's model thread (tokenizing,
copying outputs), the realtime lane's thread and the event loop that takes calls and hands
answers back. While one of them computes in Python, CPython hands the GIL to a waiting
thread only after its switch interval, 5 ms by default, and a realtime request crosses
threads several times on its way through: each crossing could wait that long behind a
batch-class pass's tokenizing. With 0.5 ms, while a Batch API job ran, a realtime single
text's median went from 48 to 45 ms and its p99 from 114 to 103 ms (medians of 12 and 15
windows of 15 s, four and five servers started in turn), the job's texts/s unchanged
(docs/benchmarks.md, "Alternated rounds"): a small gain, smaller than one window's noise.
The runtimes' own threads (OpenVINO, ONNX Runtime, torch) release the GIL and are not
affected. `TRIBUTARY_SWITCH_INTERVAL_S` in the environment the cluster started with sets
another (0.005 puts CPython's default back).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

SWITCH_INTERVAL_S = 0.0005


def shorten_thread_switch() -> None:
    """Call once in a serving process: a waiting thread gets the GIL within 0.5 ms."""
    sys.setswitchinterval(switch_interval_s(os.environ))


def switch_interval_s(environ: Mapping[str, str]) -> float:
    """The interval the environment asks for, else SWITCH_INTERVAL_S; a value that is not a
    positive number is ignored."""
    try:
        asked = float(environ.get("TRIBUTARY_SWITCH_INTERVAL_S", SWITCH_INTERVAL_S))
    except ValueError:
        return SWITCH_INTERVAL_S
    return asked if 0 < asked < 1 else SWITCH_INTERVAL_S
