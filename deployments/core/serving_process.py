"""What every serving process (the ingress, each model replica) sets for itself once, in one
place: how it traces allocations when asked, how soon a waiting thread gets the GIL, and how
often Python's cycle collector runs."""

from __future__ import annotations

from deployments.core.allocation_trace import trace_allocations
from deployments.core.gc_policy import relax_collector
from deployments.core.thread_switch import shorten_thread_switch


def tune_serving_process(name: str, *, collect_less: bool = True) -> None:
    """Call in the process, once its start-up work is done. `collect_less=False` keeps
    CPython's collector thresholds: the generation replica's, whose engine step was never
    measured with the relaxed ones (gc_policy.py measured the ingress and the embedders)."""
    if collect_less:
        relax_collector()
    shorten_thread_switch()
    trace_allocations(name)
