from deployments.core.batching.token_window import TokenWindow

WINDOW = TokenWindow(prefix=(101,), suffix=(102,), max_tokens=6)


def test_short_input_is_wrapped_in_special_tokens() -> None:
    assert WINDOW.wrap([1, 2, 3]) == ([101, 1, 2, 3, 102], False)


def test_long_input_keeps_its_head_and_both_special_tokens() -> None:
    ids, cut = WINDOW.wrap([1, 2, 3, 4, 5, 6, 7])
    assert ids == [101, 1, 2, 3, 4, 102]
    assert cut is True
    assert WINDOW.full_length([1, 2, 3, 4, 5, 6, 7]) == 9


def test_input_exactly_at_the_limit_is_not_cut() -> None:
    assert WINDOW.wrap([1, 2, 3, 4]) == ([101, 1, 2, 3, 4, 102], False)
