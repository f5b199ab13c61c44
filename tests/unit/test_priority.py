from dataclasses import dataclass

import pytest

from deployments.core.priority import ALL_PRIORITIES, Priority, next_in_line


def test_lower_value_is_served_first() -> None:
    assert Priority.REALTIME < Priority.NORMAL < Priority.BATCH
    assert ALL_PRIORITIES == (Priority.REALTIME, Priority.NORMAL, Priority.BATCH)
    assert sorted([Priority.BATCH, Priority.REALTIME, Priority.NORMAL]) == list(ALL_PRIORITIES)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("realtime", Priority.REALTIME),
        ("NORMAL", Priority.NORMAL),
        (" Batch ", Priority.BATCH),
    ],
)
def test_parse_ignores_case_and_surrounding_space(name: str, expected: Priority) -> None:
    assert Priority.parse(name) is expected


@pytest.mark.parametrize("name", ["urgent", "", "0", "real time"])
def test_parse_names_the_choices_for_an_unknown_class(name: str) -> None:
    with pytest.raises(ValueError, match="realtime, normal, batch"):
        Priority.parse(name)


def test_label_is_the_lowercase_name_and_round_trips() -> None:
    assert [p.label for p in Priority] == ["realtime", "normal", "batch"]
    assert all(Priority.parse(p.label) is p for p in Priority)


@pytest.mark.parametrize(
    ("asked", "tier", "served"),
    [
        (Priority.REALTIME, Priority.NORMAL, Priority.NORMAL),  # above the cap: served at it
        (Priority.REALTIME, Priority.BATCH, Priority.BATCH),
        (Priority.NORMAL, Priority.BATCH, Priority.BATCH),
        (Priority.BATCH, Priority.REALTIME, Priority.BATCH),  # below the cap: unchanged
        (Priority.NORMAL, Priority.REALTIME, Priority.NORMAL),
        (Priority.NORMAL, Priority.NORMAL, Priority.NORMAL),
    ],
)
def test_capped_at_serves_a_request_above_its_tier_at_the_tier(
    asked: Priority, tier: Priority, served: Priority
) -> None:
    assert asked.capped_at(tier) is served


@dataclass
class Head:
    priority: Priority
    since: float


def test_next_in_line_is_the_highest_class_unless_a_lower_head_has_aged() -> None:
    realtime, batch = Head(Priority.REALTIME, 9.0), Head(Priority.BATCH, 0.0)
    queues = {Priority.REALTIME: [realtime], Priority.NORMAL: [], Priority.BATCH: [batch]}
    aged_after = {Priority.BATCH: 5.0}
    assert next_in_line(queues, aged_after, now=4.0) == (realtime, False)
    assert next_in_line(queues, aged_after, now=5.0) == (batch, True)  # aged past realtime
    assert next_in_line({Priority.BATCH: [batch]}, aged_after, now=5.0) == (batch, False)
    assert next_in_line({p: [] for p in Priority}, aged_after, now=5.0) == (None, False)
