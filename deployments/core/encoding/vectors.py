"""Post-processing of embedding vectors for the response."""

from __future__ import annotations

import base64

import numpy as np


def shrink_dimensions(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """Keep the first `dimensions` components and bring each row back to unit length,
    as OpenAI's `dimensions` parameter does for Matryoshka-style models."""
    if dimensions is None or dimensions >= vectors.shape[1]:
        return vectors
    cut = vectors[:, :dimensions]
    norms = np.linalg.norm(cut, axis=1, keepdims=True)
    return (cut / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


def to_base64(vector: np.ndarray) -> str:
    """OpenAI's base64 encoding: the little-endian float32 bytes of the vector."""
    return base64.b64encode(vector.astype("<f4", copy=False).tobytes()).decode("ascii")
