"""The version split: deterministic hashing, weights, stickiness, pinning."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from deployments.core.rollout.traffic import choose_version, first_key, split_pin, sticky_point


def test_a_pin_splits_off_the_last_at_sign() -> None:
    assert split_pin("minilm@2") == ("minilm", "2")
    assert split_pin("minilm") == ("minilm", None)
    assert split_pin("minilm@") == ("minilm@", None)
    assert split_pin("@2") == ("@2", None)


def test_the_same_key_falls_at_the_same_point_and_models_differ() -> None:
    assert sticky_point("m", "session:a") == sticky_point("m", "session:a")
    assert sticky_point("m", "session:a") != sticky_point("other", "session:a")
    assert 0 <= sticky_point("m", "x") < 1


def test_random_draws_follow_the_weights() -> None:
    rng = random.Random(7)
    weights = [("1", 90.0), ("2", 10.0)]
    seen = Counter(choose_version("m", weights, None, rng) for _ in range(20_000))
    assert abs(seen["2"] / 20_000 - 0.10) < 0.01


def test_sticky_keys_spread_by_the_weights_and_stay_put() -> None:
    weights = [("1", 50.0), ("2", 50.0)]
    keys = [f"session:{i}" for i in range(10_000)]
    first = {key: choose_version("m", weights, key) for key in keys}
    share = sum(1 for v in first.values() if v == "2") / len(keys)
    assert abs(share - 0.5) < 0.02
    assert all(choose_version("m", weights, key) == first[key] for key in keys[:500])


def test_moving_weight_to_a_canary_moves_only_callers_who_must_move() -> None:
    keys = [f"api_key:{i}" for i in range(5_000)]
    at_10 = {k: choose_version("m", [("1", 90.0), ("2", 10.0)], k) for k in keys}
    at_50 = {k: choose_version("m", [("1", 50.0), ("2", 50.0)], k) for k in keys}
    # Growing the canary only adds callers to it: none of its callers goes back.
    assert all(at_50[k] == "2" for k, v in at_10.items() if v == "2")


def test_all_weights_zero_serves_the_first_version() -> None:
    assert choose_version("m", [("1", 0.0), ("2", 0.0)], "session:x") == "1"
    with pytest.raises(ValueError):
        choose_version("m", [], None)


def test_a_zero_weight_version_never_gets_unpinned_traffic() -> None:
    rng = random.Random(1)
    weights = [("1", 1.0), ("2", 0.0), ("3", 1.0)]
    assert "2" not in {choose_version("m", weights, None, rng) for _ in range(2000)}


def test_the_first_key_in_the_policy_order_wins() -> None:
    keys = {"session": None, "user": "u1", "api_key": "Bearer k"}
    assert first_key(keys, ["session", "user", "api_key"]) == "user:u1"
    assert first_key(keys, ["api_key", "user"]) == "api_key:Bearer k"
    assert first_key(keys, []) is None
