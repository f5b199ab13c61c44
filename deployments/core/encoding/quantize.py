"""Embedding precisions as sentence-transformers' `quantize_embeddings` computes them, in pure
numpy so the ingress needs no torch: int8/uint8 scale each dimension over the range the
request's own vectors span (no calibration set), binary/ubinary pack the signs into bits."""

from __future__ import annotations

from typing import Literal

import numpy as np

Precision = Literal["float32", "int8", "uint8", "binary", "ubinary"]


class RangeUnknown(ValueError):
    """int8/uint8 of a single vector: there is no range to scale it over."""


def quantize(vectors: np.ndarray, precision: Precision) -> np.ndarray:
    """`vectors` (n, dim) float as `precision`; the same numbers sentence-transformers gives
    for `quantize_embeddings(vectors, precision)` without ranges or calibration."""
    if precision == "float32":
        return vectors.astype(np.float32)
    if precision in ("int8", "uint8"):
        if vectors.shape[0] < 2:
            # sentence-transformers refuses this too: a single vector spans no range.
            raise RangeUnknown(f"{precision} needs at least two vectors to compute its ranges")
        starts = vectors.min(axis=0).astype(np.float32)
        steps = (vectors.max(axis=0).astype(np.float32) - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        buckets = np.clip(np.floor((vectors - starts) / steps), 0, 255)
        if precision == "uint8":
            return buckets.astype(np.uint8)
        return (buckets - 128).astype(np.int8)
    packed = np.packbits(vectors > 0, axis=-1)
    if precision == "ubinary":
        return packed
    return (packed - 128).astype(np.int8)
