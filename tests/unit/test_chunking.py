import pytest

from deployments.core.chunking import chunk_count, chunk_spans, combine_scores


def test_a_short_text_is_one_chunk() -> None:
    assert chunk_spans(0, 10, 2) == [(0, 0)]
    assert chunk_spans(10, 10, 2) == [(0, 10)]


def test_chunks_overlap_and_cover_everything() -> None:
    spans = chunk_spans(25, 10, 3)
    assert spans == [(0, 10), (5, 15), (10, 20), (15, 25)]
    covered = {i for start, end in spans for i in range(start, end)}
    assert covered == set(range(25))
    assert all(end - start == 10 for start, end in spans)


def test_overlap_is_clamped_so_chunks_always_advance() -> None:
    spans = chunk_spans(5, 2, 7)
    assert spans[0] == (0, 2) and spans[-1] == (3, 5)
    assert [s for s, _ in spans] == sorted({s for s, _ in spans})


def test_a_long_text_has_a_bounded_number_of_chunks() -> None:
    assert len(chunk_spans(6500, 254, 32)) == 30


def test_bad_size() -> None:
    with pytest.raises(ValueError):
        chunk_spans(5, 0, 0)


def test_combine_scores() -> None:
    assert combine_scores([0.1, 0.9, 0.2]) == 0.9
    assert combine_scores([0.1, 0.9, 0.2], "mean") == pytest.approx(0.4)
    assert combine_scores([0.1, 0.9], "first") == 0.1
    with pytest.raises(ValueError):
        combine_scores([])


def test_chunk_count_is_the_number_of_spans() -> None:
    for length in range(0, 120, 7):
        for size in (1, 5, 16, 254):
            for overlap in (0, 3, 32, 300):
                expected = len(chunk_spans(length, size, overlap))
                assert chunk_count(length, size, overlap) == expected, (length, size, overlap)
