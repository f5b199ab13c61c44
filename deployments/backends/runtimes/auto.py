"""`runtime: auto` with its choice kept on disk: measure once, then only re-check.

On a hit the kept runtime alone is built (its export is already in the cache) and its
output checked against torch fp32 on a small probe, which keeps a stale or tampered choice
from serving wrong vectors; no candidate is timed. When the kept one fails to build or no
longer agrees, or the file is missing or unreadable, every candidate is measured as before
(runtime_choice.choose) and the file rewritten. Nothing about the cache file can fail a
start: the worst case is a measurement.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from deployments.backends.runtimes import cache as runtime_cache
from deployments.backends.runtimes.choice import REFERENCE, Choice, Forward

logger = logging.getLogger(__name__)


def keep_or_measure(
    key: dict[str, Any],
    path: Path,
    build: Callable[[str], Forward],
    measure: Callable[[], Choice],
    probe: Any,
    agreement: Callable[[np.ndarray, np.ndarray], float],
    min_agreement: float,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> tuple[Forward, dict[str, Any]]:
    """The forward pass to run and the report of how it was chosen (for info())."""
    with lock_or_not(path):
        kept, why = runtime_cache.read(path, key)
        if kept is not None:
            forward, score, why = _recheck(kept, build, probe, agreement, min_agreement)
            if forward is not None:
                logger.info(
                    "runtime auto kept %s (measured %s, %s), agreement with fp32 now %.6f",
                    kept.runtime,
                    kept.measured_at,
                    path,
                    score,
                )
                return forward, {
                    **kept.report,
                    "decided": "kept",
                    "measured_at": kept.measured_at,
                    "cache_file": str(path),
                    "agreement_now": score,
                    "summary": f"{_agreeing(kept.report)}, kept from {_day(kept.measured_at)}",
                }
        choice = measure()
        measured_at = now().isoformat(timespec="seconds")
        # The file keeps the measurement; how this start came by it is added per start.
        measured = {**choice.report(), "min_agreement": min_agreement}
        report = {**measured, "decided": "measured", "measured_at": measured_at}
        report["measured_because"] = why
        try:
            runtime_cache.write(path, key, choice.runtime, measured, measured_at)
            report["cache_file"] = str(path)
        except OSError as exc:  # a read-only cache costs the next start a measurement
            logger.warning("runtime auto: could not keep the choice in %s: %s", path, exc)
            report["cache_file"] = None
        report["summary"] = f"{_agreeing(report)}, measured now"
        logger.info("runtime auto chose %s (%s): %s", choice.runtime, why, choice.reason)
        return choice.forward, report


def _recheck(
    kept: runtime_cache.Kept,
    build: Callable[[str], Forward],
    probe: Any,
    agreement: Callable[[np.ndarray, np.ndarray], float],
    min_agreement: float,
) -> tuple[Forward | None, float, str]:
    """The kept runtime's forward and its agreement with fp32 now; None and why not when
    it no longer builds, runs or agrees."""
    if kept.runtime == REFERENCE:
        return build(REFERENCE), 1.0, ""
    try:
        reference = np.asarray(build(REFERENCE)(probe))
        forward = build(kept.runtime)
        score = float(agreement(np.asarray(forward(probe)), reference))
    except Exception as exc:  # the kept one cannot run here any more: measure again
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        return None, 0.0, f"kept {kept.runtime} failed: {type(exc).__name__}: {first_line}"
    if not np.isfinite(score) or score < min_agreement:
        why = f"kept {kept.runtime} no longer agrees ({score:.6f} < {min_agreement})"
        return None, score, why
    return forward, round(score, 6), ""


def _agreeing(report: dict[str, Any]) -> str:
    candidates = report.get("candidates") or []
    agreeing = sum(1 for c in candidates if isinstance(c, dict) and not c.get("rejected"))
    return f"fastest of {agreeing} agreeing"


def _day(measured_at: str) -> str:
    try:
        return datetime.fromisoformat(measured_at).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return measured_at


@contextlib.contextmanager
def lock_or_not(path: Path) -> Iterator[None]:
    """runtime_cache.locked, or no lock where the cache directory cannot hold one
    (read-only): the start goes on, unlocked."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(runtime_cache.locked(path))
        except OSError as exc:
            logger.warning("runtime auto: no lock for %s (%s); going on without", path, exc)
        yield
