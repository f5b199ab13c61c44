"""How a shadow version's answer agrees with the primary's, per task. Pure numpy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def embedding_agreement(primary: np.ndarray, shadow: np.ndarray) -> float:
    """The lowest cosine between the two versions' vectors of the same input: one input
    the candidate gets wrong should show, not be averaged away."""
    if primary.shape != shadow.shape:
        return 0.0  # a different width cannot agree (and cannot be compared)
    a = primary.astype(np.float64)
    b = shadow.astype(np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosines = np.einsum("ij,ij->i", a, b) / np.where(norms == 0, 1.0, norms)
    return float(cosines.min()) if len(cosines) else 1.0


def top1_agreement(primary: Sequence[float], shadow: Sequence[float]) -> float:
    """1.0 when both versions put the same document first, else 0.0."""
    if not primary or len(primary) != len(shadow):
        return 0.0
    return 1.0 if int(np.argmax(primary)) == int(np.argmax(shadow)) else 0.0


def rank_correlation(primary: Sequence[float], shadow: Sequence[float]) -> float:
    """Spearman's rho of the two versions' scores over the same documents (1 = the same
    order); a single document agrees trivially."""
    if len(primary) != len(shadow):
        return 0.0
    if len(primary) < 2:
        return 1.0
    a = _ranks(np.asarray(primary, dtype=np.float64))
    b = _ranks(np.asarray(shadow, dtype=np.float64))
    if a.std() == 0 or b.std() == 0:
        return 1.0 if a.std() == b.std() else 0.0
    return float(np.corrcoef(a, b)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    # Average ranks for ties, so equal scores do not invent an order.
    order = values.argsort(kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(len(values), dtype=np.float64)
    for value in np.unique(values):
        tied = values == value
        if tied.sum() > 1:
            ranks[tied] = ranks[tied].mean()
    return ranks


def exact_match(primary: str, shadow: str) -> float:
    return 1.0 if primary == shadow else 0.0
