"""Raw reranker scores mapped into [0, 1], the scale rerank clients expect.

A cross-encoder's raw score is a logit: the sigmoid maps it into (0, 1), 0.5 meaning the
model is undecided (what sentence-transformers' CrossEncoder does for one-label models).
A bi-encoder's raw score is the cosine of two unit vectors, in [-1, 1]: (cos + 1) / 2 maps
it linearly into [0, 1] and keeps the order. The two scales are not comparable with each
other: a bi-encoder's cosine for unrelated texts sits around 0 to 0.2, i.e. 0.5 to 0.6.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

ScoreKind = Literal["logit", "cosine"]


def to_relevance(raw: np.ndarray, kind: ScoreKind) -> np.ndarray:
    raw = np.asarray(raw, dtype=np.float64)
    if kind == "logit":
        return 1.0 / (1.0 + np.exp(-raw))
    return np.clip((raw + 1.0) / 2.0, 0.0, 1.0)
