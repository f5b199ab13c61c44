"""How often Python's cycle collector runs in a serving process.

CPython collects its youngest generation every 700 new container objects and the whole
heap every hundred young collections. A request through the ingress makes hundreds of such
objects (the parsed body, the job, futures, the answer's dict and bytes), and in process
the collector took 37 % of a single-text request's CPU (bench/cost_budget.py: 133 us with
the defaults, 84 with the thresholds below); a replica, with torch and transformers loaded,
pays more per full collection. Almost nothing a request makes is part of a cycle, and
reference counting frees it at once, so collecting far less often frees the same memory a
little later. What start-up built is frozen out of every later collection.
"""

from __future__ import annotations

import gc

# Young generation every 20,000 new container objects (CPython's default: 700); the older
# two after 20 and 100 collections of the one below (defaults 10 and 10).
THRESHOLDS = (20_000, 20, 100)


def relax_collector() -> None:
    """Call once start-up is done: freezes what exists and collects less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
