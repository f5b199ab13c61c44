"""`runtime: auto`: try each candidate backend, keep the fastest that agrees with fp32.

Pure logic, no torch: a candidate is a name and a `forward` callable (a batch in, an array
out). torch fp32 is the reference and always a candidate (its agreement is 1 by
definition). Every other candidate is first checked on a probe batch against the
reference's output, and rejected below `min_agreement`; those that pass are timed in
interleaved rounds at each batch size the replica will run (so a noisy moment hurts every
candidate alike), and the one with the least time per text, summed over those batch sizes
(each size weighs the same), is kept. Whatever fails to build or to run is rejected with
its reason, never fatal, except the reference itself. Each candidate's first call at each
size is untimed (one-off set-up costs such as oneDNN's primitive creation).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

REFERENCE = "torch-fp32"
Forward = Callable[[Any], np.ndarray]


@dataclass
class Trial:
    """What `auto` learnt about one candidate."""

    runtime: str
    agreement: float | None = None
    texts_per_s: dict[int, float] = field(default_factory=dict)
    rejected: str | None = None

    def seconds_per_text(self) -> float:
        return sum(1.0 / rate for rate in self.texts_per_s.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "agreement": None if self.agreement is None else round(self.agreement, 6),
            "texts_per_s": {str(n): round(r, 1) for n, r in sorted(self.texts_per_s.items())},
            "rejected": self.rejected,
        }


@dataclass
class Choice:
    runtime: str
    forward: Forward
    trials: list[Trial]
    reason: str

    def report(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime,
            "reason": self.reason,
            "candidates": [t.as_dict() for t in self.trials],
        }


def min_cosine(candidate: np.ndarray, reference: np.ndarray) -> float:
    """The worst row's cosine between two batches of vectors."""
    a = np.asarray(candidate, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosines = np.einsum("ij,ij->i", a, b) / np.maximum(norms, 1e-12)
    return float(cosines.min())


def score_correlation(candidate: np.ndarray, reference: np.ndarray) -> float:
    """Agreement of two score vectors: their Pearson correlation (the cosine of the
    centred scores), so a backend that shifts the ranking scores low. Identical constant
    vectors agree fully; a constant against a varying one does not."""
    a = np.asarray(candidate, dtype=np.float64).ravel()
    b = np.asarray(reference, dtype=np.float64).ravel()
    a, b = a - a.mean(), b - b.mean()
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    if norms < 1e-12:
        return 1.0 if np.allclose(a, b) else 0.0
    return float(np.dot(a, b) / norms)


def choose(
    candidates: Sequence[str],
    build: Callable[[str], Forward],
    probe: Any,
    batches: dict[int, Any],
    agreement: Callable[[np.ndarray, np.ndarray], float],
    min_agreement: float,
    rounds: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> Choice:
    """Build every candidate, reject those below `min_agreement` with the reference on
    `probe`, time the rest on `batches` (batch size -> batch) and keep the fastest."""
    names = [REFERENCE, *(c for c in candidates if c != REFERENCE)]
    trials = {name: Trial(name) for name in names}
    forwards: dict[str, Forward] = {REFERENCE: build(REFERENCE)}
    reference = np.asarray(forwards[REFERENCE](probe))
    trials[REFERENCE].agreement = 1.0
    for name in names[1:]:
        trial = trials[name]
        try:
            forward = build(name)
            trial.agreement = agreement(np.asarray(forward(probe)), reference)
        except Exception as exc:  # a candidate that cannot run is skipped, not fatal
            trial.rejected = f"failed: {type(exc).__name__}: {_one_line(exc)}"
            continue
        if not np.isfinite(trial.agreement) or trial.agreement < min_agreement:
            trial.rejected = f"agreement {trial.agreement:.6f} < {min_agreement}"
            continue
        forwards[name] = forward
    samples: dict[str, dict[int, list[float]]] = {n: {s: [] for s in batches} for n in forwards}
    # Round 0 is untimed: a runtime's first call at a new shape pays one-off set-up costs.
    for round_ in range(max(1, rounds) + 1):
        for name, forward in list(forwards.items()):
            for size, batch in batches.items():
                start = clock()
                try:
                    forward(batch)
                except Exception as exc:
                    if name == REFERENCE:
                        raise
                    trials[name].rejected = f"failed: {type(exc).__name__}: {_one_line(exc)}"
                    del forwards[name], samples[name]
                    break
                if round_:
                    samples[name][size].append(max(clock() - start, 1e-9))
    for name, by_size in samples.items():
        trials[name].texts_per_s = {s: s / statistics.median(t) for s, t in by_size.items()}
    kept = min(forwards, key=lambda n: trials[n].seconds_per_text())
    ordered = sorted(forwards, key=lambda n: trials[n].seconds_per_text())
    reason = _reason(trials[kept], [trials[n] for n in ordered], trials, min_agreement)
    # Drop the losers: only the kept backend stays in memory.
    return Choice(kept, forwards[kept], list(trials.values()), reason)


def _reason(kept: Trial, ranked: list[Trial], trials: dict[str, Trial], floor: float) -> str:
    sizes = ", ".join(str(s) for s in sorted(kept.texts_per_s))
    parts = [f"fastest of {len(ranked)} agreeing candidate(s) at batch sizes {sizes}"]
    if len(ranked) > 1:
        runner_up = ranked[1]
        gain = runner_up.seconds_per_text() / kept.seconds_per_text()
        parts.append(f"{gain:.2f}x {runner_up.runtime}")
    parts.append(f"agreement with fp32 {kept.agreement:.6f} (floor {floor})")
    rejected = [f"{t.runtime}: {t.rejected}" for t in trials.values() if t.rejected]
    if rejected:
        parts.append("rejected " + "; ".join(rejected))
    return ", ".join(parts)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else ""
