"""TextStream: text deltas from a growing token list, and stop sequences."""

from __future__ import annotations

from collections.abc import Sequence

from deployments.backends.generation.text_stream import TextStream

WORDS = {1: "the", 2: "cat", 3: "sat", 4: "on", 5: "mat"}


def decode(ids: Sequence[int]) -> str:
    return " ".join(WORDS[i] for i in ids)


def test_deltas_add_up_to_the_whole_text() -> None:
    stream = TextStream(decode)
    tokens = [1, 2, 3, 4, 5]
    parts = [stream.update(tokens[: i + 1], final=i == 4).text for i in range(5)]
    assert "".join(parts) == "the cat sat on mat"


def test_stop_sequence_cuts_the_text_and_is_never_sent() -> None:
    stream = TextStream(decode, stop=["sat"])
    sent = stream.update([1], final=False).text + stream.update([1, 2], final=False).text
    delta = stream.update([1, 2, 3], final=False)
    assert delta.stopped
    assert sent + delta.text == "the cat "


def test_text_that_may_begin_a_stop_sequence_is_held_back_until_final() -> None:
    stream = TextStream(decode, stop=["cat nap"])
    # The last len("cat nap") - 1 = 6 characters could begin the stop sequence.
    assert stream.update([1, 2], final=False).text == "t"
    delta = stream.update([1, 2], final=True)
    assert not delta.stopped and delta.text == "he cat"


def test_half_a_character_waits_for_the_rest() -> None:
    texts = {1: "caf", 2: "caf\ufffd", 3: "café"}
    stream = TextStream(lambda ids: texts[len(ids)])
    assert stream.update([1], final=False).text == "caf"
    assert stream.update([1, 2], final=False).text == ""
    assert stream.update([1, 2, 3], final=True).text == "é"
