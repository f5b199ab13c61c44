"""The GIL's switch interval of a serving process (core/thread_switch.py)."""

from __future__ import annotations

import sys

from deployments.core.thread_switch import (
    SWITCH_INTERVAL_S,
    shorten_thread_switch,
    switch_interval_s,
)


def test_the_default_is_a_tenth_of_cpythons() -> None:
    assert switch_interval_s({}) == SWITCH_INTERVAL_S == 0.0005


def test_the_environment_may_set_another_and_nonsense_is_ignored() -> None:
    assert switch_interval_s({"TRIBUTARY_SWITCH_INTERVAL_S": "0.005"}) == 0.005
    for nonsense in ("", "fast", "0", "-1", "5", "nan"):
        assert switch_interval_s({"TRIBUTARY_SWITCH_INTERVAL_S": nonsense}) == SWITCH_INTERVAL_S


def test_shortening_sets_the_interpreters_interval() -> None:
    before = sys.getswitchinterval()
    try:
        shorten_thread_switch()
        assert abs(sys.getswitchinterval() - SWITCH_INTERVAL_S) < 1e-9
    finally:
        sys.setswitchinterval(before)
