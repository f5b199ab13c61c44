import pytest

from deployments.core.priority import ALL_PRIORITIES, Priority


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
