import base64

import numpy as np

from deployments.core.encoding.vectors import shrink_dimensions, to_base64


def test_shrinking_keeps_the_head_and_renormalises() -> None:
    vectors = np.array([[3.0, 4.0, 12.0], [1.0, 0.0, 0.0]], dtype=np.float32)
    shrunk = shrink_dimensions(vectors, 2)
    assert shrunk.shape == (2, 2)
    np.testing.assert_allclose(shrunk[0], [0.6, 0.8], rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(shrunk, axis=1), [1.0, 1.0], rtol=1e-6)


def test_no_dimensions_or_too_many_leaves_vectors_alone() -> None:
    vectors = np.ones((1, 3), dtype=np.float32)
    assert shrink_dimensions(vectors, None) is vectors
    assert shrink_dimensions(vectors, 3) is vectors


def test_base64_is_little_endian_float32() -> None:
    vector = np.array([1.5, -2.0], dtype=np.float32)
    decoded = np.frombuffer(base64.b64decode(to_base64(vector)), dtype="<f4")
    np.testing.assert_array_equal(decoded, vector)
