"""core/encoding/quantize.py against sentence-transformers' own quantize_embeddings."""

import logging

import numpy as np
import pytest
from sentence_transformers.util.quantization import quantize_embeddings

from deployments.core.encoding.quantize import RangeUnknown, quantize

PRECISIONS = ["float32", "int8", "uint8", "binary", "ubinary"]


def unit_vectors(rows: int, dim: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture(autouse=True)
def quiet_calibration_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)  # "buckets based on N embeddings": expected here


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize(("rows", "dim"), [(2, 8), (5, 384), (40, 13)])
def test_every_precision_equals_sentence_transformers(precision: str, rows: int, dim: int) -> None:
    vectors = unit_vectors(rows, dim, seed=rows * dim)
    ours = quantize(vectors, precision)  # type: ignore[arg-type]
    theirs = quantize_embeddings(vectors, precision)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("precision", ["int8", "uint8"])
def test_a_dimension_without_range_matches_too(precision: str) -> None:
    vectors = unit_vectors(3, 16, seed=1)
    vectors[:, 5] = 0.25  # max == min: sentence-transformers steps by 1 there
    assert np.array_equal(quantize(vectors, precision), quantize_embeddings(vectors, precision))


@pytest.mark.parametrize("precision", ["int8", "uint8"])
def test_one_vector_has_no_range_in_either(precision: str) -> None:
    vectors = unit_vectors(1, 8, seed=2)
    with pytest.raises(RangeUnknown):
        quantize(vectors, precision)
    with pytest.raises(ValueError):
        quantize_embeddings(vectors, precision)


def test_binary_is_ubinary_offset_by_minus_128() -> None:
    vectors = unit_vectors(4, 24, seed=3)
    packed = quantize(vectors, "ubinary")
    assert packed.shape == (4, 3)
    assert np.array_equal(quantize(vectors, "binary"), (packed.astype(np.int16) - 128))
