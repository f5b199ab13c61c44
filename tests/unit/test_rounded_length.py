"""OpenVINO's passes run at lengths rounded up to a multiple of LENGTH_STEP, the added
tokens masked out, so a mixed load meets few shapes (runtimes/build.py)."""

from __future__ import annotations

import numpy as np

from deployments.backends.runtimes.build import LENGTH_STEP, LONGEST_ROUNDED, rounded_length


def features(rows: int, length: int) -> dict[str, np.ndarray]:
    ids = np.arange(1, rows * length + 1, dtype=np.int64).reshape(rows, length)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": ids * 0}


def test_a_length_is_rounded_up_with_masked_tokens() -> None:
    given = features(3, LENGTH_STEP + 1)
    out = rounded_length(given)
    assert {name: v.shape for name, v in out.items()} == {
        name: (3, 2 * LENGTH_STEP) for name in given
    }
    assert (out["attention_mask"][:, LENGTH_STEP + 1 :] == 0).all()
    assert (out["input_ids"][:, : LENGTH_STEP + 1] == given["input_ids"]).all()
    assert (out["attention_mask"][:, : LENGTH_STEP + 1] == 1).all()


def test_a_length_on_a_step_or_past_the_positions_is_left_as_it_is() -> None:
    on_step = features(2, 2 * LENGTH_STEP)
    assert rounded_length(on_step) is on_step
    assert rounded_length(features(1, LONGEST_ROUNDED - 1))["input_ids"].shape == (
        1,
        LONGEST_ROUNDED,
    )
    past = features(1, LONGEST_ROUNDED + 1)
    assert rounded_length(past) is past


def test_inputs_without_a_mask_are_left_as_they_are() -> None:
    plain = {"input_ids": np.ones((2, 5), dtype=np.int64)}
    assert rounded_length(plain) is plain
